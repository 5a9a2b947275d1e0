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

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}
