//! The job secret across the hosts of the test cluster, under each real engine: a job
//! of `switchyard launch --launcher ssh|slurm|mpi` on node0-node2 with a secret file
//! (the path travels, never the secret), and a stranger on node3, a host outside the
//! job, that tries rank 0's place at the launcher's rendezvous without the secret: it
//! is refused, and the job finishes.
//!
//! Needs root, openssh-server, Slurm and OpenMPI: without them every test says why and
//! returns, unless `SWITCHYARD_REQUIRE_CLUSTER=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::cluster::Cluster;
use crate::support::{example, run_bounded};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const SECRET: &str = "c1u57e25ec2e7c1u57e25ec2e7c1u57e";

/// Rank 0's program: first the stranger, from node3 over ssh, with the launcher's
/// rendezvous and rank 0's place but no secret; it must fail. Then the real worker.
fn stranger_first(cluster: &Cluster) -> std::path::PathBuf {
    let worker = example("netns_worker");
    let script = format!(
        r#"#!/bin/sh
if [ "$SWITCHYARD_RANK" = 0 ]; then
    if ssh -F {config} -o BatchMode=yes node3 env SWITCHYARD_RANK=0 \
        SWITCHYARD_WORLD_SIZE="$SWITCHYARD_WORLD_SIZE" \
        SWITCHYARD_RENDEZVOUS="$SWITCHYARD_RENDEZVOUS" \
        {worker} env --iters 1 --timeout 10 </dev/null; then
        echo "STRANGER ACCEPTED"
        exit 9
    fi
    echo "stranger refused"
fi
exec {worker} env --iters 20 --timeout 20
"#,
        config = cluster.ssh_config().display(),
        worker = worker.display()
    );
    let path = cluster.dir().join("stranger_first.sh");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_stranger_on_another_host_is_refused_under_every_engine() {
    let Some(cluster) = Cluster::up_with_slurm(4) else {
        return;
    };
    let secret = cluster.dir().join("job.secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let program = stranger_first(&cluster);
    let hostfile = cluster.write_hostfile("job_hosts", &[0, 1, 2], 1);
    let ssh_args = format!("-F {}", cluster.ssh_config().display());
    for engine in ["ssh", "slurm", "mpi"] {
        let mut launch = vec![
            env!("CARGO_BIN_EXE_switchyard").to_string(),
            "launch".into(),
            "-n".into(),
            "3".into(),
            "--launcher".into(),
            engine.into(),
            "--timeout".into(),
            "90".into(),
            "--rendezvous-timeout".into(),
            "40".into(),
        ];
        match engine {
            "ssh" => launch.extend([
                "--hostfile".into(),
                hostfile.display().to_string(),
                "--launcher-args".into(),
                ssh_args.clone(),
            ]),
            "mpi" => launch.extend(["--hostfile".into(), hostfile.display().to_string()]),
            _ => {}
        }
        launch.extend(["--".into(), program.display().to_string()]);
        let mut c = if engine == "slurm" {
            // Inside an allocation of node0-node2, as `salloc` gives one.
            let mut c = cluster.command(0, "salloc");
            c.args(["-N", "3", "-w", "node[0-2]", "--ntasks-per-node=1"])
                .args(&launch);
            c
        } else {
            let mut c = cluster.command(0, &launch[0]);
            c.args(&launch[1..]);
            c
        };
        cluster.openmpi_env(&mut c);
        c.env("SWITCHYARD_JOB_SECRET_FILE", &secret)
            .env_remove("SWITCHYARD_JOB_SECRET");
        let (out, _) = run_bounded(c, Duration::from_secs(150));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!("{stdout}\n{stderr}");
        assert!(out.status.success(), "{engine}: {all}");
        assert!(all.contains("[0] stranger refused"), "{engine}: {all}");
        assert!(!all.contains("STRANGER ACCEPTED"), "{engine}: {all}");
        assert!(
            all.contains("the launcher expects a job secret"),
            "{engine}: the stranger was not told why: {all}"
        );
        for rank in 0..3 {
            assert!(
                stdout
                    .lines()
                    .any(|l| l == format!("[{rank}] done iters=20")),
                "{engine}: rank {rank} did not finish: {all}"
            );
            let joined = format!("[{rank}] joined rank={rank} ");
            let host = format!(" host=node{rank} ");
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&joined) && l.contains(&host)),
                "{engine}: rank {rank} not on node{rank}: {all}"
            );
        }
        assert!(!all.contains(SECRET), "{engine}: the secret was printed");
    }
}
