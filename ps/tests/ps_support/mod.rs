//! A parameter-server job as threads of the test process.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use switchyard_ps::{
    JobReport, KvServer, Mode, PsConfig, PsError, Scheduler, ServerReport, Update, Value,
};

/// Short liveness settings, so that failure tests end in seconds.
pub(crate) fn config(workers: usize, servers: usize) -> PsConfig {
    PsConfig::new(workers, servers)
        .with_liveness(Duration::from_millis(50), Duration::from_millis(1500))
        .with_request_timeout(Duration::from_secs(20))
        .with_join_timeout(Duration::from_secs(20))
}

/// A fresh endpoint for `scheme` ("local", "inproc" or "tcp").
pub(crate) fn endpoint(scheme: &str, test: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    match scheme {
        "tcp" => "tcp://127.0.0.1:0".to_string(),
        other => format!("{other}://ps-{test}-{n}"),
    }
}

/// A scheduler and its servers, running.
pub(crate) struct Job {
    pub(crate) endpoint: String,
    pub(crate) config: PsConfig,
    pub(crate) scheduler: JoinHandle<Result<JobReport, PsError>>,
    pub(crate) servers: Vec<JoinHandle<Result<ServerReport, PsError>>>,
}

impl Job {
    /// Starts a scheduler on `endpoint` and `config.num_servers` servers of `f32`.
    pub(crate) fn start(endpoint: &str, config: PsConfig, mode: Mode, update: Update<f32>) -> Job {
        Job::start_of::<f32>(endpoint, config, mode, update)
    }

    /// [`Job::start`] with servers of `T`.
    pub(crate) fn start_of<T: Value>(
        endpoint: &str,
        config: PsConfig,
        mode: Mode,
        update: Update<T>,
    ) -> Job {
        let scheduler = Scheduler::bind(endpoint, &config).expect("scheduler binds");
        let endpoint = scheduler.endpoint().to_string();
        let scheduler = std::thread::spawn(move || scheduler.run());
        let servers = (0..config.num_servers)
            .map(|_| {
                let (e, c, u) = (endpoint.clone(), config.clone(), update.clone());
                std::thread::spawn(move || KvServer::<T>::join(&e, &c, mode, u)?.run())
            })
            .collect();
        Job {
            endpoint,
            config,
            scheduler,
            servers,
        }
    }

    /// Waits for the scheduler and the servers to return.
    pub(crate) fn end(
        self,
    ) -> (
        Result<JobReport, PsError>,
        Vec<Result<ServerReport, PsError>>,
    ) {
        let servers = self
            .servers
            .into_iter()
            .map(|s| s.join().expect("server thread"))
            .collect();
        (self.scheduler.join().expect("scheduler thread"), servers)
    }

    /// Waits and checks that the job ended well.
    pub(crate) fn end_ok(self) {
        let (scheduler, servers) = self.end();
        scheduler.expect("scheduler ends well");
        for s in servers {
            s.expect("server ends well");
        }
    }
}

/// Runs `f(rank_hint)` on `n` worker threads and returns their results in thread
/// order.
pub(crate) fn on_workers<R: Send + 'static>(
    n: u32,
    f: impl Fn(u32) -> Result<R, PsError> + Send + Sync + 'static,
) -> Vec<Result<R, PsError>> {
    let f = std::sync::Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let f = f.clone();
            std::thread::spawn(move || f(i))
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("worker thread"))
        .collect()
}
