#!/usr/bin/env python3
"""Reads a crate's entry in a Cargo registry index (what `cargo publish` itself consults).

    registry-index.py [--registry NAME] CRATE
    registry-index.py [--registry NAME] --same-sources CRATE VERSION LOCAL.crate

The first form prints the crate's index entry, one JSON object per published version (`vers`,
`cksum`, `yanked`, ...), and exits 0; exits 3 when the registry has no crate of that name.

The second downloads CRATE VERSION from the registry (its `dl` address) and compares it with
LOCAL.crate file by file, except `.cargo_vcs_info.json` (the commit it was packaged from),
`Cargo.lock` of a library (no dependent ever reads it) and the checksums in a binary crate's
`Cargo.lock` (those of the siblings change with that commit too):
exits 0 when they hold the same files (and prints the published commit), 4 when they differ
(and prints the paths that differ).

Both exit 1 with a message naming the registry and the crate on any other failure.

The registry is crates.io (its sparse index) unless --registry names one of cargo's
configuration: `CARGO_REGISTRIES_<NAME>_INDEX`, else `[registries.<NAME>] index` in the
`.cargo/config.toml` of the working directory or its ancestors, then `$CARGO_HOME/config.toml`
(cargo's own lookup order). Index forms: `sparse+http(s)://…`, `file://DIR` (a git index: its
committed HEAD, as cargo reads it) and any other git URL (cloned shallowly).
"""

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import json
import tomllib
import urllib.error
import urllib.request

CRATES_IO_INDEX = "sparse+https://index.crates.io/"
NOT_FOUND = 3
DIFFERENT = 4
VCS_INFO = ".cargo_vcs_info.json"


def fail(message):
    print(f"registry-index: {message}", file=sys.stderr)
    sys.exit(1)


def index_path(name):
    """The path of a crate's file in an index (cargo's layout, lower-case)."""
    n = name.lower()
    if len(n) <= 2:
        return f"{len(n)}/{n}"
    if len(n) == 3:
        return f"3/{n[0]}/{n}"
    return f"{n[0:2]}/{n[2:4]}/{n}"


def configured_index(registry):
    env = "CARGO_REGISTRIES_" + registry.upper().replace("-", "_") + "_INDEX"
    if os.environ.get(env):
        return os.environ[env]
    candidates = []
    directory = os.getcwd()
    while True:
        candidates += [os.path.join(directory, ".cargo", "config.toml"), os.path.join(directory, ".cargo", "config")]
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    cargo_home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    candidates += [os.path.join(cargo_home, "config.toml"), os.path.join(cargo_home, "config")]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as f:
                config = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            fail(f"cannot read cargo configuration {path}: {e}")
        index = config.get("registries", {}).get(registry, {}).get("index")
        if index:
            return index
    fail(f"registry '{registry}' is not configured: set {env}, or [registries.{registry}] index in a cargo config.toml")


def read_sparse(base, name, shown):
    url = base[len("sparse+"):]
    if not url.endswith("/"):
        url += "/"
    try:
        with urllib.request.urlopen(url + index_path(name), timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as e:
        if e.code in (404, 410, 451):
            return None
        fail(f"{shown}: reading the index entry of '{name}' failed: HTTP {e.code}")
    except (urllib.error.URLError, TimeoutError) as e:
        fail(f"{shown}: reading the index entry of '{name}' failed: {e}")


def read_git(repository, name, shown, path=None):
    path = path or index_path(name)
    listed = subprocess.run(["git", "-C", repository, "ls-tree", "--name-only", "HEAD", path],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        fail(f"{shown}: {repository} is not a readable git index: {listed.stderr.strip()}")
    if not listed.stdout.strip():
        return None
    shown_file = subprocess.run(["git", "-C", repository, "show", f"HEAD:{path}"], capture_output=True, text=True)
    if shown_file.returncode != 0:
        fail(f"{shown}: reading {path} failed: {shown_file.stderr.strip()}")
    return shown_file.stdout


def read_index_file(index, path_name, shown, path=None):
    """The index's file for crate `path_name` (or at `path`, e.g. config.json); None if absent."""
    if index.startswith("sparse+"):
        if path is not None:
            return read_sparse_path(index, path, shown)
        return read_sparse(index, path_name, shown)
    if index.startswith("file://"):
        return read_git(index[len("file://"):], path_name, shown, path)
    with tempfile.TemporaryDirectory() as clone:
        cloned = subprocess.run(["git", "clone", "--quiet", "--depth", "1", index, clone],
                                capture_output=True, text=True)
        if cloned.returncode != 0:
            fail(f"{shown}: cloning the index failed: {cloned.stderr.strip()}")
        return read_git(clone, path_name, shown, path)


def read_sparse_path(base, path, shown):
    url = base[len("sparse+"):]
    if not url.endswith("/"):
        url += "/"
    try:
        with urllib.request.urlopen(url + path, timeout=30) as response:
            return response.read().decode()
    except (urllib.error.URLError, TimeoutError) as e:
        fail(f"{shown}: reading {path} of the index failed: {e}")


def download_url(index, name, version, shown):
    text = read_index_file(index, name, shown, path="config.json")
    if text is None:
        fail(f"{shown}: the index has no config.json")
    try:
        dl = json.loads(text)["dl"]
    except (ValueError, KeyError) as e:
        fail(f"{shown}: config.json has no valid 'dl': {e}")
    markers = ("{crate}", "{version}", "{prefix}", "{lowerprefix}", "{sha256-checksum}")
    if not any(m in dl for m in markers):
        return f"{dl.rstrip('/')}/{name}/{version}/download"
    prefix = index_path(name).rsplit("/", 1)[0]
    return (dl.replace("{crate}", name).replace("{version}", version)
            .replace("{prefix}", prefix).replace("{lowerprefix}", prefix.lower()))


def crate_files(data, shown):
    files = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive.getmembers():
                if not member.isfile():
                    continue
                relative = member.name.split("/", 1)[-1]
                files[relative] = archive.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as e:
        fail(f"{shown}: not a .crate archive: {e}")
    return files


def comparable(path, data):
    """A file as compared: Cargo.lock without its checksums (a staged sibling's checksum
    changes with the commit it was packaged at, as its .cargo_vcs_info.json does)."""
    if path != "Cargo.lock" or data is None:
        return data
    return b"\n".join(line for line in data.split(b"\n") if not line.startswith(b"checksum = "))


def same_sources(index, name, version, local, shown):
    url = download_url(index, name, version, shown)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            published = crate_files(response.read(), f"{shown}: {name} {version}")
    except (urllib.error.URLError, TimeoutError) as e:
        fail(f"{shown}: downloading {name} {version} ({url}) failed: {e}")
    with open(local, "rb") as f:
        packaged = crate_files(f.read(), local)
    # A library's Cargo.lock is never used by what depends on it (cargo reads the root's lock
    # only; `cargo install` reads a binary crate's): it differs when a sibling of the other
    # release train moved (a framework patch release), and that changes nothing published.
    library = not any(p == "src/main.rs" or p.startswith("src/bin/") for p in packaged) and (
        b"[[bin]]" not in packaged.get("Cargo.toml", b""))
    ignored = {VCS_INFO} | ({"Cargo.lock"} if library else set())
    differ = sorted(p for p in set(published) | set(packaged)
                    if p not in ignored and comparable(p, published.get(p)) != comparable(p, packaged.get(p)))
    if differ:
        print("\n".join(differ))
        sys.exit(DIFFERENT)
    try:
        commit = json.loads(published.get(VCS_INFO, b"{}")).get("git", {}).get("sha1", "unknown")
    except ValueError:
        commit = "unknown"
    print(commit)


def main(argv):
    registry = None
    if len(argv) >= 2 and argv[0] == "--registry":
        registry, argv = argv[1], argv[2:]
    compare = len(argv) == 4 and argv[0] == "--same-sources"
    if len(argv) != 1 and not compare:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    index = configured_index(registry) if registry else CRATES_IO_INDEX
    shown = f"registry '{registry}' ({index})" if registry else "crates.io"
    if compare:
        same_sources(index, argv[1], argv[2], argv[3], shown)
        return
    name = argv[0]
    text = read_index_file(index, name, shown)
    if text is None:
        sys.exit(NOT_FOUND)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
