//! A cluster of hosts with real daemons for the cluster tests, started and stopped by
//! `scripts/test-cluster.sh` (which a developer can also run by hand): host `i` is a
//! network namespace with its own host name `node{i}` and address `10.79.0.{i+1}`,
//! running a real sshd that takes the cluster's key.
//!
//! [`Cluster::up`] needs root, sshd and nsenter. Where they are missing it says why
//! and returns `None`, and the test returns early; `SWITCHYARD_REQUIRE_CLUSTER=1`
//! (set by `.ci/run`) makes that a failure. Dropping the [`Cluster`] takes it down
//! (every process in its hosts killed, namespaces deleted, nothing left mounted), also
//! when the test panics; a test process killed outright leaves it to the next
//! `up`, which sweeps test clusters (`SYC_OWNER`) whose owner has died.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Set to `1` to make a cluster that cannot start a test failure instead of a skip.
pub(crate) const ENV_REQUIRE: &str = "SWITCHYARD_REQUIRE_CLUSTER";

/// The script that starts and stops clusters.
pub(crate) fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/test-cluster.sh")
}

/// A running cluster, taken down on drop.
#[derive(Debug)]
pub(crate) struct Cluster {
    dir: PathBuf,
    hosts: usize,
}

/// Prints why the test does not run, or fails it when the cluster is required.
fn skip(why: &str) -> Option<Cluster> {
    let required = std::env::var(ENV_REQUIRE).is_ok_and(|v| v.trim() == "1");
    assert!(
        !required,
        "{ENV_REQUIRE}=1 but the test cluster cannot start: {why}"
    );
    eprintln!(
        "skipped: the test cluster cannot start here ({why}); {ENV_REQUIRE}=1 makes this a failure"
    );
    None
}

impl Cluster {
    /// `hosts` hosts, each running sshd; `None` (after saying why) where a cluster
    /// cannot start here.
    pub(crate) fn up(hosts: usize) -> Option<Cluster> {
        Cluster::start(hosts, false)
    }

    /// As [`Cluster::up`], and Slurm too: slurmctld on node0, slurmd on every host
    /// (partition `test`, 4 CPUs a host); commands made by [`Cluster::command`] find it.
    pub(crate) fn up_with_slurm(hosts: usize) -> Option<Cluster> {
        Cluster::start(hosts, true)
    }

    /// As [`Cluster::up`], where `mpirun` is installed too (`None` after saying why
    /// where it is not).
    pub(crate) fn up_with_mpirun(hosts: usize) -> Option<Cluster> {
        if Command::new("mpirun").arg("--version").output().is_err() {
            return skip("no mpirun (apt install openmpi-bin)");
        }
        Cluster::up(hosts)
    }

    /// Whether a cluster (with Slurm if `slurm`) can start here; if not, says why
    /// (or fails the test under [`ENV_REQUIRE`]) and returns false.
    pub(crate) fn can_start(slurm: bool) -> bool {
        let uid = Command::new("id").arg("-u").output().map(|o| o.stdout);
        let why = if !uid.is_ok_and(|u| u.trim_ascii() == b"0") {
            "not root: network namespaces need it"
        } else if !Path::new("/usr/sbin/sshd").exists() {
            "no /usr/sbin/sshd (apt install openssh-server)"
        } else if slurm && !Path::new("/usr/sbin/slurmctld").exists() {
            "no /usr/sbin/slurmctld (apt install slurmctld slurmd munge)"
        } else {
            return true;
        };
        skip(why).is_some()
    }

    fn start(hosts: usize, slurm: bool) -> Option<Cluster> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        if !Cluster::can_start(slurm) {
            return None;
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("switchyard-cluster-{pid}-{n}"));
        let out = Command::new("bash")
            .arg(script())
            .arg("up")
            .arg(&dir)
            .arg(hosts.to_string())
            .args(slurm.then_some("--slurm"))
            .env("SYC_OWNER", pid.to_string())
            .env("SYC_TAG", format!("syc{pid}x{n}"))
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/test-cluster.sh");
        if !out.status.success() {
            return skip(&format!(
                "scripts/test-cluster.sh up failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Some(Cluster { dir, hosts })
    }

    /// How many hosts.
    pub(crate) fn len(&self) -> usize {
        self.hosts
    }

    /// Host `i`'s name (`node{i}`): what the hostfile and the ssh config use.
    pub(crate) fn name(i: usize) -> String {
        format!("node{i}")
    }

    /// Host `i`'s address.
    pub(crate) fn addr(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 79, 0, u8::try_from(i + 1).expect("at most 200 hosts"))
    }

    /// The hostfile, `node0` to `node{N-1}`, one per line.
    pub(crate) fn hostfile(&self) -> PathBuf {
        self.dir.join("hostfile")
    }

    /// The ssh configuration that logs in to every host by name (`ssh -F`).
    pub(crate) fn ssh_config(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// The cluster's folder (keys, logs; removed on drop).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// `program` to be run on host `i`, in its network and with its host name (and,
    /// on a cluster with Slurm, `SLURM_CONF` naming its configuration).
    pub(crate) fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("bash");
        c.arg(script())
            .arg("exec")
            .arg(&self.dir)
            .arg(i.to_string())
            .arg(program)
            .env("SLURM_CONF", self.dir.join("slurm/slurm.conf"));
        c
    }

    /// Writes a hostfile of the hosts `hosts`, `slots` each, into the cluster's folder.
    pub(crate) fn write_hostfile(&self, name: &str, hosts: &[usize], slots: usize) -> PathBuf {
        let path = self.dir.join(name);
        let lines: String = hosts
            .iter()
            .map(|&i| format!("{} slots={slots}\n", Cluster::name(i)))
            .collect();
        std::fs::write(&path, lines).unwrap();
        path
    }

    /// Sets on `command` what OpenMPI needs to run across the cluster: root, its
    /// daemons started over the cluster's ssh, its traffic on the hosts' `eth0`.
    pub(crate) fn openmpi_env(&self, command: &mut Command) {
        command
            .envs(switchyard_mpirun::OPENMPI_ENV)
            .env(
                "OMPI_MCA_plm_rsh_args",
                format!("-F {}", self.ssh_config().display()),
            )
            .env("OMPI_MCA_btl_tcp_if_include", "eth0")
            .env("OMPI_MCA_oob_tcp_if_include", "eth0");
    }

    /// Stops host `i`'s sshd: the host is up but refuses logins.
    pub(crate) fn stop_sshd(&self, i: usize) {
        let out = Command::new("bash")
            .arg(script())
            .args(["stop-sshd"])
            .arg(&self.dir)
            .arg(i.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "stop-sshd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The namespace of host `i` (`/run/netns/...`).
    fn netns(&self, i: usize) -> String {
        let tag = std::fs::read_to_string(self.dir.join("tag")).unwrap();
        format!("{}h{i}", tag.trim())
    }

    /// The processes running `exe` on host `i`, as PIDs.
    pub(crate) fn running_on(&self, i: usize, exe: &Path) -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.netns(i)])
            .output()
            .unwrap();
        let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
            .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == exe))
            .collect()
    }

    /// Every `(host, pid)` running `exe` anywhere in the cluster.
    pub(crate) fn running(&self, exe: &Path) -> Vec<(usize, u32)> {
        (0..self.hosts)
            .flat_map(|i| self.running_on(i, exe).into_iter().map(move |p| (i, p)))
            .collect()
    }

    /// Waits until nothing runs the example `program` on any host, up to `limit`;
    /// the leftovers, as `(host, pid)`, if any.
    pub(crate) fn wait_none_running(&self, program: &str, limit: Duration) -> Vec<(usize, u32)> {
        let exe = crate::support::example(program);
        let until = Instant::now() + limit;
        loop {
            let left = self.running(&exe);
            if left.is_empty() || Instant::now() >= until {
                return left;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What `examples/netns_worker.rs` says when it has joined:
/// `joined rank=R world=N addr=A task=T host=H engine=E`, after `[T] ` under a
/// launcher. Ordered by rank first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Joined {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) addr: String,
    pub(crate) host: String,
    pub(crate) engine: String,
    /// The launcher's `[T] ` prefix (`None` without a launcher).
    pub(crate) prefix: Option<usize>,
}

impl Joined {
    /// The line's fields, or `None` for another line.
    pub(crate) fn parse(line: &str) -> Option<Joined> {
        let (head, rest) = line.split_once("joined ")?;
        let prefix = match head {
            "" => None,
            head => Some(head.strip_prefix('[')?.strip_suffix("] ")?.parse().ok()?),
        };
        let field = |name: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        Some(Joined {
            rank: field("rank")?.parse().ok()?,
            world: field("world")?.parse().ok()?,
            addr: field("addr")?,
            host: field("host")?,
            engine: field("engine")?,
            prefix,
        })
    }

    /// Every joined line of `text`, in rank order.
    pub(crate) fn all(text: &str) -> Vec<Joined> {
        let mut all: Vec<Joined> = text.lines().filter_map(Joined::parse).collect();
        all.sort();
        all
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = Command::new("bash")
            .arg(script())
            .arg("down")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output();
        match out {
            // `down` leaves files the tests wrote (batch scripts, hostfiles): the
            // folder is this test's own.
            Ok(out) if out.status.success() => {
                let _ = std::fs::remove_dir_all(&self.dir);
            }
            Ok(out) => eprintln!(
                "cluster harness: down failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => eprintln!("cluster harness: could not run the script: {e}"),
        }
    }
}
