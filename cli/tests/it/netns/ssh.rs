//! A real sshd on each host of a [`Net`], for `switchyard launch --launcher ssh`
//! across the harness's hosts: `scripts/test-cluster.sh sshd-in` starts them (one
//! piece with the test cluster's), logins by address with the keys and `ssh_config`
//! it writes, passed to the launcher as `--launcher-args "-F ssh_config"`.

use super::Net;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The sshds, their keys, the client configuration and a hostfile; on drop every
/// process in the hosts (the sshds and whatever they started) is killed and the
/// folder removed.
#[derive(Debug)]
pub(crate) struct SshCluster {
    dir: PathBuf,
    namespaces: Vec<String>,
}

impl SshCluster {
    /// An sshd on every host of `net`, and a hostfile that lists the hosts `order`
    /// (host indices) by address, one slot each.
    pub(crate) fn new(net: &Net, order: &[usize]) -> SshCluster {
        let dir = std::env::temp_dir().join(format!("switchyard-{}", net.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let namespaces: Vec<String> = (0..net.len()).map(|i| net.ns(i).to_string()).collect();
        let cluster = SshCluster { dir, namespaces };
        let out = Command::new("bash")
            .arg(crate::cluster::script())
            .arg("sshd-in")
            .arg(&cluster.dir)
            .args((0..net.len()).map(|i| format!("{}={}", net.ns(i), Net::addr(i))))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "scripts/test-cluster.sh sshd-in: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let hosts: String = order
            .iter()
            .map(|&i| format!("{}\n", Net::addr(i)))
            .collect();
        std::fs::write(cluster.dir.join("hosts"), hosts).unwrap();
        cluster
    }

    /// The hostfile.
    pub(crate) fn hostfile(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    /// `--launcher-args` for these hosts: ssh with their configuration.
    pub(crate) fn launcher_args(&self) -> String {
        format!("-F {}", self.dir.join("ssh_config").display())
    }

    /// The folder (for messages).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for SshCluster {
    /// Deleting a namespace does not end its processes: every one goes first.
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
                continue;
            };
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
