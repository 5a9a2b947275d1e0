//! Child processes that never outlive the test that started them.
//!
//! Every server is started through `setpriv --pdeathsig KILL`, so the kernel kills it when the
//! thread that spawned it exits, even if the test process is killed with SIGKILL and no `Drop`
//! runs. A [`ManagedProcess`] also stops its child when dropped and, when the drop happens
//! during a panic (a failing test), prints the tail of the child's log.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use nix::{sys::signal::Signal, unistd::Pid};

/// How many trailing log lines are printed for each process when a test fails.
const LOG_TAIL_LINES: usize = 60;

/// A running child process whose stdout and stderr go to a log file.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Option<Child>,
    log_path: PathBuf,
    stop_signal: Signal,
}

impl ManagedProcess {
    /// Starts `program` with `args`, writing both output streams to `log_path`.
    ///
    /// `stop_signal` is sent when the handle drops (SIGKILL if the process ignores it for 5 s).
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
        log_path: &Path,
        stop_signal: Signal,
    ) -> Result<Self> {
        let log = File::create(log_path).with_context(|| format!("creating log {}", log_path.display()))?;
        let mut command = Command::new("setpriv");
        command
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, v) in envs {
            command.env(k, v);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log_path: log_path.to_path_buf(),
            stop_signal,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The log file holding the process's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Fails if the process has already exited, naming its exit status and log tail.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!(
                "{} exited early with {status}; log tail:\n{}",
                self.name,
                tail(&self.log_path, LOG_TAIL_LINES)
            );
        }
        Ok(())
    }

    /// Waits up to `timeout` for a log line matching `pred`, returning it.
    pub fn wait_for_log_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut file = File::open(&self.log_path)?;
        let mut pending = String::new();
        loop {
            let mut chunk = String::new();
            file.read_to_string(&mut chunk)?;
            pending.push_str(&chunk);
            while let Some(pos) = pending.find('\n') {
                let line: String = pending.drain(..=pos).collect();
                if pred(line.trim_end()) {
                    return Ok(line.trim_end().to_string());
                }
            }
            self.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "{}: no expected log line within {timeout:?}; log tail:\n{}",
                    self.name,
                    tail(&self.log_path, LOG_TAIL_LINES)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        let pid = Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal).with_context(|| format!("sending {signal} to {}", self.name))
    }

    /// Waits for the process to exit and returns its exit code (None when killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>> {
        let deadline = Instant::now() + timeout;
        let Some(child) = self.child.as_mut() else {
            bail!("{} was already reaped", self.name)
        };
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status.code());
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the process (stop signal, then SIGKILL after 5 s) and reaps it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let pid = Pid::from_raw(child.id() as i32);
        if self.stop_signal != Signal::SIGKILL {
            let _ = nix::sys::signal::kill(pid, self.stop_signal);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- last {LOG_TAIL_LINES} lines of {} ({}) -----\n{}\n----- end of {} -----",
                self.name,
                self.log_path.display(),
                tail(&self.log_path, LOG_TAIL_LINES),
                self.name
            );
        }
        self.stop();
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let Ok(file) = File::open(path) else {
        return String::from("(no log)");
    };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(|l| l.ok()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A TCP port on 127.0.0.1 for a server the tests start (etcd, kube-apiserver, moto, a CCM),
/// which binds it itself a moment later. Two things keep that moment race-free:
///
/// - the port is outside the kernel's ephemeral range (`ip_local_port_range`), so no
///   `bind(0)` and no outgoing connection of any process is given it meanwhile;
/// - the test process holds an exclusive lock on `$TMPDIR/rcp-ports/<port>.lock` for the rest
///   of its life, so no other test process (nextest runs several) picks it too. The kernel
///   drops the lock when the process ends, however it ends.
pub fn free_port() -> u16 {
    use rand::Rng;
    static HELD: std::sync::Mutex<Vec<File>> = std::sync::Mutex::new(Vec::new());
    let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            let mut it = r.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    let range = if low > 11_000 {
        10_000..low
    } else {
        high.saturating_add(1)..65_535
    };
    let dir = std::env::temp_dir().join("rcp-ports");
    let _ = std::fs::create_dir_all(&dir);
    for _ in 0..1000 {
        let port = rand::rng().random_range(range.clone());
        let Ok(lock) = File::create(dir.join(format!("{port}.lock"))) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
            return port;
        }
    }
    // Fallback: a port the kernel had free a moment ago.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

#[cfg(test)]
mod tests {
    #[test]
    fn free_ports_are_outside_the_ephemeral_range_and_never_handed_out_twice() {
        let ports: Vec<u16> = (0..50).map(|_| super::free_port()).collect();
        let mut unique = ports.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
        if let Some(low) = range
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u16>().ok())
        {
            assert!(ports.iter().all(|p| *p < low), "{ports:?} vs {range}");
        }
    }
}
