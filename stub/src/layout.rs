use crate::StubError;
use switchyard_msg::{Addr, Role};

/// How many worker and server threads a job has and how they are spread over
/// processes (Singa's cluster configuration).
///
/// Workers are numbered group by group (`group * workers_per_group + id`) and packed
/// `workers_per_process` to a process, starting at process 0. Servers are numbered the
/// same way and packed `servers_per_process` to a process: after the worker processes
/// when `separate_servers` is set, or into the same processes (starting at 0) when it
/// is not.
///
/// # Examples
///
/// Two worker groups of two workers, one server group of two servers, each process
/// holding two workers, servers in processes of their own:
///
/// ```
/// use switchyard_stub::ClusterLayout;
/// # fn main() -> Result<(), switchyard_stub::StubError> {
/// let layout = ClusterLayout::new(2, 2, 1, 2).with_workers_per_process(2).with_servers_per_process(2);
/// assert_eq!(layout.num_processes()?, 3);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterLayout {
    /// Number of worker groups.
    pub worker_groups: u32,
    /// Workers in each group.
    pub workers_per_group: u32,
    /// Number of server groups.
    pub server_groups: u32,
    /// Servers in each group.
    pub servers_per_group: u32,
    /// Worker threads hosted by one process.
    pub workers_per_process: u32,
    /// Server threads hosted by one process.
    pub servers_per_process: u32,
    /// Servers in processes of their own (`true`, the default) or sharing the worker
    /// processes.
    pub separate_servers: bool,
}

impl ClusterLayout {
    /// A layout with the given groups, one worker and one server per process, servers
    /// in processes of their own.
    pub fn new(
        worker_groups: u32,
        workers_per_group: u32,
        server_groups: u32,
        servers_per_group: u32,
    ) -> Self {
        ClusterLayout {
            worker_groups,
            workers_per_group,
            server_groups,
            servers_per_group,
            workers_per_process: 1,
            servers_per_process: 1,
            separate_servers: true,
        }
    }

    /// Sets [`ClusterLayout::workers_per_process`].
    pub fn with_workers_per_process(mut self, n: u32) -> Self {
        self.workers_per_process = n;
        self
    }

    /// Sets [`ClusterLayout::servers_per_process`].
    pub fn with_servers_per_process(mut self, n: u32) -> Self {
        self.servers_per_process = n;
        self
    }

    /// Sets [`ClusterLayout::separate_servers`].
    pub fn with_separate_servers(mut self, separate: bool) -> Self {
        self.separate_servers = separate;
        self
    }

    /// Total worker threads.
    pub fn total_workers(&self) -> u64 {
        u64::from(self.worker_groups) * u64::from(self.workers_per_group)
    }

    /// Total server threads.
    pub fn total_servers(&self) -> u64 {
        u64::from(self.server_groups) * u64::from(self.servers_per_group)
    }

    fn check(&self) -> Result<(), StubError> {
        let bad = |reason: &str| {
            Err(StubError::Layout {
                reason: reason.to_string(),
            })
        };
        if self.total_workers() + self.total_servers() == 0 {
            return bad("the layout has no threads");
        }
        if self.total_workers() > 0 && self.workers_per_process == 0 {
            return bad("workers_per_process is 0 but there are workers");
        }
        if self.total_servers() > 0 && self.servers_per_process == 0 {
            return bad("servers_per_process is 0 but there are servers");
        }
        if self.total_workers() + self.total_servers() > 1 << 24 {
            return bad("more than 2^24 threads");
        }
        Ok(())
    }

    fn worker_processes(&self) -> u64 {
        match self.workers_per_process {
            0 => 0,
            n => self.total_workers().div_ceil(u64::from(n)),
        }
    }

    fn server_processes(&self) -> u64 {
        match self.servers_per_process {
            0 => 0,
            n => self.total_servers().div_ceil(u64::from(n)),
        }
    }

    /// Number of processes the layout needs.
    pub fn num_processes(&self) -> Result<usize, StubError> {
        self.check()?;
        let n = if self.separate_servers {
            self.worker_processes() + self.server_processes()
        } else {
            self.worker_processes().max(self.server_processes())
        };
        Ok(n as usize)
    }

    /// The process hosting `addr`, or `None` if the layout has no such thread.
    pub fn process_of(&self, addr: Addr) -> Option<usize> {
        match addr.role {
            Role::Worker if addr.group < self.worker_groups && addr.id < self.workers_per_group => {
                let index =
                    u64::from(addr.group) * u64::from(self.workers_per_group) + u64::from(addr.id);
                Some((index / u64::from(self.workers_per_process.max(1))) as usize)
            }
            Role::Server if addr.group < self.server_groups && addr.id < self.servers_per_group => {
                let index =
                    u64::from(addr.group) * u64::from(self.servers_per_group) + u64::from(addr.id);
                let base = if self.separate_servers {
                    self.worker_processes()
                } else {
                    0
                };
                Some((base + index / u64::from(self.servers_per_process.max(1))) as usize)
            }
            _ => None,
        }
    }

    /// Every thread address in the layout: workers group by group, then servers.
    pub fn addresses(&self) -> impl Iterator<Item = Addr> + '_ {
        let workers = (0..self.worker_groups)
            .flat_map(move |g| (0..self.workers_per_group).map(move |i| Addr::worker(g, i)));
        let servers = (0..self.server_groups)
            .flat_map(move |g| (0..self.servers_per_group).map(move |i| Addr::server(g, i)));
        workers.chain(servers)
    }
}
