//! Real parts for the interop tests: the `cronoq-broker` of this checkout and Python peers, as
//! child processes on 127.0.0.1. Nothing of cronoq is mocked.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's root (where `python -m cronoq.broker.cli` finds this checkout's cronoq).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The Python that runs cronoq: `CRONOQ_PYTHON` (the README's test command sets it), else `python3`.
pub fn python() -> String {
    std::env::var("CRONOQ_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A free TCP port on 127.0.0.1 right now. Under the Python suite (which may run other tests beside this one)
/// it comes from the block of ports that suite set aside for this run, `CRONOQ_TEST_PORTS=FIRST-LAST`, in
/// turn: a port the OS picks (bind to 0, close) could be picked again for someone else before the broker binds
/// it. Run by hand, without the variable, the OS picks.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let bindable = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    if let Some((first, last)) = std::env::var("CRONOQ_TEST_PORTS").ok().and_then(|v| {
        let (a, b) = v.split_once('-')?;
        Some((a.parse::<u16>().ok()?, b.parse::<u16>().ok()?))
    }) {
        let count = usize::from(last - first) + 1;
        for _ in 0..count {
            let port = first + (NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % count) as u16;
            if bindable(port) {
                return port;
            }
        }
        panic!("no free port left in CRONOQ_TEST_PORTS={first}-{last}");
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A scratch directory for one test, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("cronoq-rust-{name}-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process whose output goes to a log file; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(args: &[&str], log: &Path, env: &[(&str, &str)]) -> Proc {
        Proc::spawn_in(&repo_root(), args, log, env)
    }

    /// [`spawn`](Self::spawn) with the `cronoq` package found in `code` instead of this checkout.
    pub fn spawn_in(code: &Path, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Proc {
        let out = std::fs::File::create(log).unwrap();
        let mut cmd = Command::new(python());
        cmd.args(args)
            .current_dir(code)
            .env("PYTHONPATH", code)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", python()));
        Proc { child, log: log.to_path_buf() }
    }

    pub fn output(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// Wait for a line containing `text`; panic showing the output after `timeout` or an exit.
    pub fn wait_for(&mut self, text: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let out = self.output();
            if let Some(line) = out.lines().find(|l| l.contains(text)) {
                return line.to_string();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}) before printing {text:?}:\n{out}", self.log.display());
            }
            if Instant::now() > end {
                panic!("no {text:?} from {} within {timeout:?}:\n{out}", self.log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait for the process to exit; its output.
    pub fn finish(&mut self, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let out = self.output();
                assert!(status.success(), "{} failed ({status}):\n{out}", self.log.display());
                return out;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("{} did not finish within {timeout:?}:\n{}", self.log.display(), self.output());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real broker started from a config body (pools, auth) on fresh loopback ports.
pub struct Broker {
    pub proc: Proc,
    pub clients: String,
    pub workers: String,
    pub config: PathBuf,
    env: Vec<(String, String)>,
    /// Where its `cronoq` package is: this checkout, or an older one's.
    code: PathBuf,
}

impl Broker {
    /// Start `python -m cronoq.broker.cli -c FILE`; `broker_extra` goes under `[broker]`.
    pub fn start(dir: &Path, body: &str, broker_extra: &str, env: &[(&str, &str)]) -> Broker {
        Broker::start_from(&repo_root(), dir, body, broker_extra, env)
    }

    /// A broker whose only pool is `pool`, keeping its journal in `dir/data`: what a restart or a
    /// standby's takeover finds again.
    pub fn durable(dir: &Path, pool: &str) -> Broker {
        let data_dir = format!("data_dir = \"{}\"", dir.join("data").display());
        Broker::start(dir, &format!("[[pools]]\nname = \"{pool}\"\n"), &data_dir, &[])
    }

    /// [`start`](Self::start) with the `cronoq` package in `code` (see [`cronoq_before`]).
    pub fn start_from(code: &Path, dir: &Path, body: &str, broker_extra: &str, env: &[(&str, &str)]) -> Broker {
        let clients = format!("tcp://127.0.0.1:{}", free_port());
        let workers = format!("tcp://127.0.0.1:{}", free_port());
        let config = dir.join("cronoq.toml");
        let text = format!(
            "[broker]\nclients = \"{clients}\"\nworkers = \"{workers}\"\nheartbeat_interval = 0.5\n{broker_extra}\n\n{body}\n"
        );
        std::fs::write(&config, text).unwrap();
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let proc = Broker::spawn(code, &config, &env);
        Broker { proc, clients, workers, config, env, code: code.to_path_buf() }
    }

    fn spawn(code: &Path, config: &Path, env: &[(String, String)]) -> Proc {
        let log = config.with_extension(format!("{}.log", free_port()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut proc = Proc::spawn_in(
            code,
            &["-m", "cronoq.broker.cli", "-c", config.to_str().unwrap(), "--log-level", "WARNING"],
            &log,
            &env,
        );
        proc.wait_for("cronoq broker ready", Duration::from_secs(60));
        proc
    }

    /// A `--standby` broker on this one's config file (so on its data_dir), with endpoints of its
    /// own: started, and standing by until this one's lock on the data_dir goes.
    pub fn standby(&self) -> Broker {
        let clients = format!("tcp://127.0.0.1:{}", free_port());
        let workers = format!("tcp://127.0.0.1:{}", free_port());
        let log = self.config.with_extension(format!("standby-{}.log", free_port()));
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let config = self.config.to_str().unwrap();
        let args = ["-m", "cronoq.broker.cli", "-c", config, "--log-level", "WARNING", "--standby"];
        let mut all = args.to_vec();
        all.extend(["--clients", clients.as_str(), "--workers", workers.as_str()]);
        let mut proc = Proc::spawn_in(&self.code, &all, &log, &env);
        proc.wait_for("cronoq broker standing by", Duration::from_secs(60));
        Broker { proc, clients, workers, config: self.config.clone(), env: self.env.clone(), code: self.code.clone() }
    }

    /// Kill the broker (SIGKILL: no goodbye) and start it again on the same config and ports.
    pub fn crash_and_restart(&mut self) {
        self.proc.kill();
        self.proc = Broker::spawn(&self.code, &self.config, &self.env);
    }
}

/// Run a Python script (`python -c`) with these arguments; its stdout once it succeeded.
pub fn run_python(script: &str, args: &[&str], dir: &Path, name: &str) -> Proc {
    let mut all = vec!["-c", script];
    all.extend_from_slice(args);
    Proc::spawn(&all, &dir.join(format!("{name}.log")), &[])
}

/// Members of a cluster, started from one config file (its `[cluster]` table lists them all), each
/// with `--member NAME` on loopback ports of its own.
pub struct Cluster {
    pub members: Vec<(String, Proc)>,
    pub config: PathBuf,
    ports: Vec<(String, String, String)>,
}

impl Cluster {
    /// Write the config (`broker_extra` under `[broker]`, then `[cluster]`, then `pools`) and start
    /// every member named.
    pub fn start(dir: &Path, names: &[&str], pools: &str, broker_extra: &str) -> Cluster {
        let ports: Vec<(String, String, String)> = names
            .iter()
            .map(|n| {
                let clients = format!("tcp://127.0.0.1:{}", free_port());
                (n.to_string(), clients, format!("tcp://127.0.0.1:{}", free_port()))
            })
            .collect();
        let config = dir.join("cluster.toml");
        let mut cluster = Cluster { members: Vec::new(), config, ports };
        cluster.write(pools, broker_extra);
        for name in names {
            let log = dir.join(format!("{name}.log"));
            let config = cluster.config.to_str().unwrap().to_string();
            let mut proc = Proc::spawn(
                &["-m", "cronoq.broker.cli", "-c", &config, "--member", name, "--log-level", "WARNING"],
                &log,
                &[],
            );
            proc.wait_for("cronoq broker ready", Duration::from_secs(60));
            cluster.members.push((name.to_string(), proc));
        }
        cluster
    }

    /// Rewrite the config file (the members reread it on SIGHUP: [`reload`](Self::reload)).
    pub fn write(&self, pools: &str, broker_extra: &str) {
        let members: String = self
            .ports
            .iter()
            .map(|(n, c, w)| format!("[[cluster.members]]\nname = \"{n}\"\nclients = \"{c}\"\nworkers = \"{w}\"\n"))
            .collect();
        let text = format!("[broker]\nheartbeat_interval = 0.2\n{broker_extra}\n\n[cluster]\n{members}\n{pools}\n");
        std::fs::write(&self.config, text).unwrap();
    }

    /// SIGHUP every member: each rereads the config file.
    pub fn reload(&self) {
        for (_, proc) in &self.members {
            // SAFETY: a plain kill(2) of a child process this test started and still holds.
            unsafe {
                libc::kill(proc.child.id() as i32, libc::SIGHUP);
            }
        }
    }

    /// The members' names, in the order they were started.
    pub fn names(&self) -> Vec<String> {
        self.ports.iter().map(|(n, _, _)| n.clone()).collect()
    }

    pub fn clients(&self, name: &str) -> String {
        self.ports.iter().find(|(n, _, _)| n == name).unwrap().1.clone()
    }

    pub fn workers(&self, name: &str) -> String {
        self.ports.iter().find(|(n, _, _)| n == name).unwrap().2.clone()
    }
}

/// The `cronoq` package as it was just before the commit that first put `text` into `path` (the
/// broker that predates a protocol field, say), unpacked from git into `dir`: an older broker to
/// test a client against, its real code. None, saying why on stderr, where the checkout has no git
/// history to take it from (a tarball, a shallow clone).
pub fn cronoq_before(text: &str, path: &str, dir: &Path) -> Option<PathBuf> {
    let git = |args: &[&str]| Command::new("git").args(args).current_dir(repo_root()).output();
    let found = match git(&["log", "--format=%H", "--reverse", "-S", text, "--", path]) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("cannot run git ({e}): no older broker to test against");
            return None;
        }
    };
    let Some(commit) = String::from_utf8_lossy(&found.stdout).lines().next().map(str::to_string) else {
        eprintln!("no git history here names {text:?} in {path}: the older broker cannot be taken from it");
        return None;
    };
    let archive = git(&["archive", "--format=tar", &format!("{commit}^"), "cronoq"]).ok()?;
    if !archive.status.success() {
        eprintln!("git cannot give the parent of {commit} (a shallow clone?): no older broker to test against");
        return None;
    }
    let code = dir.join("older");
    std::fs::create_dir_all(&code).unwrap();
    let mut tar = Command::new("tar").args(["-x", "-C"]).arg(&code).stdin(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(tar.stdin.as_mut().unwrap(), &archive.stdout).unwrap();
    drop(tar.stdin.take());
    assert!(tar.wait().unwrap().success(), "tar could not unpack the older cronoq");
    Some(code)
}

/// The fields of an `explain` answer that each scheduler takes off its own clock, or from dispatch
/// and arrival rates measured on it: a test that sets two schedulers' answers side by side compares
/// them by presence at most, never by value.
pub const EXPLAIN_TIMED: [&str; 8] = [
    "delayed_for",
    "capped_since",
    "capped_for",
    "rate_limited_for",
    "estimate",
    "estimate_note",
    "dispatch_rate",
    "arrival_rate_ahead",
];

/// Run `script` with this checkout's cronoq on the path and `input` on its stdin; what it printed
/// as JSON. Panics with its stderr if it fails.
pub fn python_json(script: &str, input: &[u8]) -> serde_json::Value {
    use std::io::Write;
    let python = python();
    let mut child = Command::new(&python)
        .args(["-c", script])
        .current_dir(repo_root())
        .env("PYTHONPATH", repo_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    let run = child.wait_with_output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    serde_json::from_slice(&run.stdout).unwrap()
}
