//! A stand-in `ssh` for `switchyard launch --launcher ssh`: `ssh [-o OPT]... HOST CMD`
//! runs `CMD` with `sh` inside the namespace of the host whose address is `HOST`, as
//! a login on that machine would. It records its arguments, one line per call.

use super::Net;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The script; `NETNS_MAP` names a file of `ADDRESS NAMESPACE` lines.
const SSH: &str = r#"#!/bin/sh
echo "ssh $*" >> "$STANDIN_LOG"
while [ "$1" = "-o" ]; do shift 2; done
host="$1"
shift
ns=$(awk -v h="$host" '$1 == h { print $2 }' "$NETNS_MAP")
if [ -z "$ns" ]; then
    echo "ssh stand-in: no namespace for host $host" >&2
    exit 255
fi
exec ip netns exec "$ns" sh -c "$*"
"#;

/// A folder with the stand-in, the address map, a hostfile and the log; removed on
/// drop.
#[derive(Debug)]
pub(crate) struct SshCluster {
    dir: PathBuf,
}

impl SshCluster {
    /// A cluster over `net` whose hostfile lists the hosts `order` (host indices), one
    /// slot each.
    pub(crate) fn new(net: &Net, order: &[usize]) -> SshCluster {
        let dir = std::env::temp_dir().join(format!("switchyard-{}", net.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let ssh = dir.join("bin").join("ssh");
        std::fs::write(&ssh, SSH).unwrap();
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
        let map: String = (0..net.len())
            .map(|i| format!("{} {}\n", Net::addr(i), net.ns(i)))
            .collect();
        std::fs::write(dir.join("map"), map).unwrap();
        let hosts: String = order
            .iter()
            .map(|&i| format!("{}\n", Net::addr(i)))
            .collect();
        std::fs::write(dir.join("hosts"), hosts).unwrap();
        SshCluster { dir }
    }

    /// The hostfile.
    pub(crate) fn hostfile(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    /// Puts the stand-in first on `command`'s `PATH` and tells it the map and log.
    pub(crate) fn wire(&self, command: &mut Command) {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.dir.join("bin")];
        dirs.extend(std::env::split_paths(&path));
        command
            .env("PATH", std::env::join_paths(dirs).unwrap())
            .env("STANDIN_LOG", self.dir.join("log"))
            .env("NETNS_MAP", self.dir.join("map"));
    }

    /// The stand-in's argument lines, one per process started.
    pub(crate) fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The folder (for messages).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for SshCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
