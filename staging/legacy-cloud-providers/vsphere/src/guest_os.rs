//! The short OS name in the instance type (VS-12): `vsphere-vm.cpu-<n>.mem-<GB>gb.os-<short>`.
//!
//! The names follow cloud-provider-vsphere's table exactly, so that Nodes migrated from it keep
//! their `node.kubernetes.io/instance-type` label: a vSphere guest ID (`ubuntu64Guest`) maps to
//! a short name (`ubuntu`), and a guest ID the table does not know (newer ones such as
//! `debian11_64Guest` among them) is `unknown`, as upstream. The table is written here as
//! families: a name, the versions that exist, and in which bitness.

/// How a family's guest IDs are spelled.
enum Ids {
    /// `<base>Guest` and `<base>64Guest`, both named `<short>`.
    Plain32And64,
    /// `<base>Guest` only.
    Only32,
    /// `<base>64Guest` only.
    Only64,
    /// `<base><v>Guest` and `<base><v>_64Guest` for each version.
    Versions32And64(&'static [&'static str]),
    /// `<base><v>Guest` only.
    Versions32(&'static [&'static str]),
    /// `<base><v>_64Guest` only.
    Versions64(&'static [&'static str]),
}

/// `(guest ID base, short name or "" for "base + version, as written", ids)`.
const FAMILIES: &[(&str, &str, Ids)] = &[
    ("asianux", "", Ids::Versions32And64(&["3", "4"])),
    ("asianux", "", Ids::Versions64(&["5", "7"])),
    ("centos", "centos", Ids::Only32),
    ("centos", "centos64", Ids::Only64),
    ("centos", "", Ids::Versions32And64(&["6", "7"])),
    ("coreos", "coreos", Ids::Only64),
    ("darwin", "darwin", Ids::Plain32And64),
    ("darwin", "darwin", Ids::Versions32And64(&["10", "11"])),
    (
        "darwin",
        "darwin",
        Ids::Versions64(&["12", "13", "14", "15", "16"]),
    ),
    (
        "debian",
        "",
        Ids::Versions32And64(&["4", "5", "6", "7", "8", "9", "10"]),
    ),
    ("dos", "dos", Ids::Only32),
    ("eComStation", "eComStation", Ids::Only32),
    ("eComStation", "", Ids::Versions32(&["2"])),
    ("fedora", "fedora", Ids::Plain32And64),
    ("freebsd", "freebsd", Ids::Plain32And64),
    ("genericLinux", "linux", Ids::Only32),
    ("mandrake", "mandrake", Ids::Only32),
    ("mandriva", "mandriva", Ids::Plain32And64),
    ("netware", "", Ids::Versions32(&["4", "5", "6"])),
    ("nld", "", Ids::Versions32(&["9"])),
    ("oes", "oes", Ids::Only32),
    ("openServer", "", Ids::Versions32(&["5", "6"])),
    ("opensuse", "opensuse", Ids::Plain32And64),
    ("oracleLinux", "oracleLinux", Ids::Plain32And64),
    ("oracleLinux", "", Ids::Versions32And64(&["6", "7"])),
    ("os2", "os2", Ids::Only32),
    ("other24xLinux", "linux", Ids::Plain32And64),
    ("other26xLinux", "linux", Ids::Plain32And64),
    ("other3xLinux", "linux", Ids::Plain32And64),
    ("otherLinux", "linux", Ids::Plain32And64),
    ("other", "other", Ids::Only32),
    ("redhat", "rhel", Ids::Only32),
    ("rhel", "", Ids::Versions32(&["2"])),
    ("rhel", "", Ids::Versions32And64(&["3", "4", "5", "6", "7"])),
    ("rhel", "", Ids::Versions64(&["8", "9", "10"])),
    ("sjds", "sjds", Ids::Only32),
    ("sles", "sles", Ids::Only32),
    ("sles", "sles64", Ids::Only64),
    ("sles", "", Ids::Versions32And64(&["10", "11", "12"])),
    ("solaris", "", Ids::Versions32(&["6", "7", "8", "9"])),
    ("solaris", "", Ids::Versions32And64(&["10"])),
    ("solaris", "", Ids::Versions64(&["11"])),
    ("suse", "suse", Ids::Plain32And64),
    ("turboLinux", "turbolinux", Ids::Plain32And64),
    ("ubuntu", "ubuntu", Ids::Plain32And64),
    ("unixWare", "unixware7", Ids::Versions32(&["7"])),
    ("vmkernel", "vmkernel", Ids::Only32),
    ("vmkernel", "", Ids::Versions32(&["5", "6", "65"])),
    ("vmwarePhoton", "photon", Ids::Only64),
    ("win2000AdvServ", "win2000advserv", Ids::Only32),
    ("win2000Pro", "win2000pro", Ids::Only32),
    ("win2000Serv", "win2000serv", Ids::Only32),
    ("win31", "win31", Ids::Only32),
    ("win95", "win95", Ids::Only32),
    ("win98", "win98", Ids::Only32),
    ("winMe", "winme", Ids::Only32),
    ("winNT", "winnt", Ids::Only32),
    ("winLonghorn", "winlonghorn", Ids::Plain32And64),
    ("winNetBusiness", "winnetbusiness", Ids::Only32),
    ("winNetDatacenter", "winnetdatacenter", Ids::Plain32And64),
    ("winNetEnterprise", "winnetenterprise", Ids::Plain32And64),
    ("winNetStandard", "winnetstandard", Ids::Plain32And64),
    ("winNetWeb", "winnetweb", Ids::Only32),
    ("winVista", "winvista", Ids::Plain32And64),
    ("winXPHome", "winxphome", Ids::Only32),
    ("winXPPro", "winxppro", Ids::Plain32And64),
    ("windows7", "win7", Ids::Versions32And64(&[""])),
    ("windows7Server", "win7server", Ids::Only64),
    ("windows8", "win8", Ids::Versions32And64(&[""])),
    ("windows8Server", "win8server", Ids::Only64),
    // Upstream names windows9 (vSphere's ID for Windows 10) `win10`.
    ("windows9", "win10", Ids::Versions32And64(&[""])),
    ("windows9Server", "win10server", Ids::Only64),
    ("windowsHyperV", "windowshyperv", Ids::Only32),
];

/// The short OS name upstream gives a guest ID, or `unknown`.
pub fn short_name(guest_id: &str) -> String {
    // One quirk outside the families: `otherGuest64` (not `other64Guest`).
    if guest_id == "otherGuest64" {
        return "other".into();
    }
    for (base, short, ids) in FAMILIES {
        let Some(rest) = guest_id.strip_prefix(base) else {
            continue;
        };
        let named = |version: &str| -> String {
            if short.is_empty() {
                format!("{base}{version}")
            } else {
                (*short).to_string()
            }
        };
        let found = match ids {
            Ids::Plain32And64 => (rest == "Guest" || rest == "64Guest").then(|| named("")),
            Ids::Only32 => (rest == "Guest").then(|| named("")),
            Ids::Only64 => (rest == "64Guest").then(|| named("")),
            Ids::Versions32And64(vs) => vs
                .iter()
                .find(|v| rest == format!("{v}Guest") || rest == format!("{v}_64Guest"))
                .map(|v| named(v)),
            Ids::Versions32(vs) => vs.iter().find(|v| rest == format!("{v}Guest")).map(|v| named(v)),
            Ids::Versions64(vs) => vs
                .iter()
                .find(|v| rest == format!("{v}_64Guest"))
                .map(|v| named(v)),
        };
        if let Some(name) = found {
            return name;
        }
    }
    "unknown".into()
}

#[cfg(test)]
mod tests {
    use super::short_name;

    #[test]
    fn upstream_names() {
        for (id, short) in [
            ("ubuntu64Guest", "ubuntu"),
            ("ubuntuGuest", "ubuntu"),
            ("rhel7_64Guest", "rhel7"),
            ("rhel9_64Guest", "rhel9"),
            ("rhel2Guest", "rhel2"),
            ("centos64Guest", "centos64"),
            ("centos7_64Guest", "centos7"),
            ("sles64Guest", "sles64"),
            ("oracleLinux64Guest", "oracleLinux"),
            ("debian10_64Guest", "debian10"),
            ("darwin16_64Guest", "darwin"),
            ("vmwarePhoton64Guest", "photon"),
            ("windows9Server64Guest", "win10server"),
            ("windows9_64Guest", "win10"),
            ("windows7Guest", "win7"),
            ("winNetDatacenter64Guest", "winnetdatacenter"),
            ("other3xLinux64Guest", "linux"),
            ("genericLinuxGuest", "linux"),
            ("otherGuest", "other"),
            ("otherGuest64", "other"),
            ("redhatGuest", "rhel"),
            ("unixWare7Guest", "unixware7"),
            ("vmkernel65Guest", "vmkernel65"),
            ("eComStation2Guest", "eComStation2"),
            ("asianux7_64Guest", "asianux7"),
        ] {
            assert_eq!(short_name(id), short, "{id}");
        }
    }

    #[test]
    fn ids_the_table_does_not_know_are_unknown() {
        for id in [
            "debian11_64Guest",
            "darwin12Guest",
            "rhel8Guest",
            "ubuntu",
            "",
            "windows2019srv_64Guest",
            "otherLinux128Guest",
            "é",
        ] {
            assert_eq!(short_name(id), "unknown", "{id}");
        }
    }
}
