use crate::{ClusterLayout, StubError};
use std::collections::HashMap;
use switchyard_msg::Addr;

/// Where a thread lives: its process and its slot among that process's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Rank of the hosting process.
    pub process: usize,
    /// Index of the thread among the hosting process's threads.
    pub slot: usize,
}

/// Every address of the job mapped to where it lives.
///
/// A pure function of the [`ClusterLayout`]: every process builds the same table
/// without talking to the others.
///
/// # Examples
///
/// ```
/// use switchyard_msg::Addr;
/// use switchyard_stub::{AddressTable, ClusterLayout};
/// # fn main() -> Result<(), switchyard_stub::StubError> {
/// let table = AddressTable::new(&ClusterLayout::new(1, 4, 1, 2).with_workers_per_process(2))?;
/// assert_eq!(table.num_processes(), 4); // two worker processes, two server processes
/// assert_eq!(table.locate(Addr::worker(0, 3)).map(|l| l.process), Some(1));
/// assert_eq!(table.locate(Addr::server(0, 1)).map(|l| l.process), Some(3));
/// assert!(table.locate(Addr::worker(0, 4)).is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct AddressTable {
    locations: HashMap<Addr, Location>,
    hosted: Vec<Vec<Addr>>,
}

impl AddressTable {
    /// Builds the table for `layout`.
    pub fn new(layout: &ClusterLayout) -> Result<Self, StubError> {
        let processes = layout.num_processes()?;
        let mut hosted = vec![Vec::new(); processes];
        let mut locations = HashMap::new();
        for addr in layout.addresses() {
            let process = layout.process_of(addr).ok_or_else(|| StubError::Layout {
                reason: format!("{addr} has no process"),
            })?;
            let threads = hosted.get_mut(process).ok_or_else(|| StubError::Layout {
                reason: format!("{addr} maps to process {process} of {processes}"),
            })?;
            locations.insert(
                addr,
                Location {
                    process,
                    slot: threads.len(),
                },
            );
            threads.push(addr);
        }
        Ok(AddressTable { locations, hosted })
    }

    /// Where `addr` lives, or `None` if no thread has it.
    pub fn locate(&self, addr: Addr) -> Option<Location> {
        self.locations.get(&addr).copied()
    }

    /// The addresses hosted by `process`, in slot order.
    pub fn hosted_by(&self, process: usize) -> &[Addr] {
        self.hosted.get(process).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Number of processes.
    pub fn num_processes(&self) -> usize {
        self.hosted.len()
    }
}
