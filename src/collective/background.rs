//! Calls that return at once: a [`Communicator`] moved onto a communication thread
//! of its own ([`Communicator::into_background`]), whose calls return a [`Pending`]
//! handle to wait on, as MPI's nonblocking collectives (`MPI_Iallreduce`, MPI 4.0
//! section 6.12) and Gloo's async work do.
//!
//! The thread takes the calls from one queue and runs each on the blocking API, in
//! the order they were issued, so every rank that issues the same calls in the same
//! order makes the same calls in the same order, which is all the mesh engine asks.
//! Each call's result goes into a slot that its handle waits on; a slot nobody waits
//! on is simply dropped, and a call whose job is dropped unrun (the thread gone)
//! fills its slot with an error on the way out, so no handle waits for nothing.

use super::Communicator;
use super::element::{ReduceOp, Reducible};
use super::error::{Call, CollectiveError};
use std::any::Any;
use std::ops::Range;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread;
use std::time::{Duration, Instant};
use switchyard_msg::payload::Element;

/// One call for the communication thread: it runs it and fills its handle's slot.
type Job = Box<dyn FnOnce(&mut Communicator) + Send>;

/// What the communication thread is asked to do, in order.
enum Order {
    Run(Job),
    /// Hand the communicator back and end.
    HandBack(Done<Communicator>),
}

/// A [`Communicator`] on a communication thread of its own: each call returns at
/// once with a [`Pending`] handle, and the thread runs the calls one after another
/// in the order they were issued.
///
/// Made by [`Communicator::into_background`]. The calls take their buffers by value
/// and hand them back through [`Pending::wait`], so the caller can go on computing
/// (the next bucket of gradients, the rest of the backward pass) while a call moves
/// data. Every rank must issue the same calls in the same order, as with the
/// blocking calls; waiting on the handles may be done in any order, or not at all.
///
/// # Errors and a failed call
///
/// A call that fails returns its error through its own handle, and makes the
/// communicator unusable as the blocking call would (see the [`Communicator`]'s
/// "After a failed call"): every call issued after it gets
/// [`CollectiveError::Poisoned`], naming the first failure, and touches no peer. A
/// call whose arguments are refused before any traffic
/// ([`CollectiveError::InvalidArgument`]) leaves it usable. A panic on the thread
/// (in a closure given to [`submit`](BackgroundCommunicator::submit)) is that call's
/// [`CollectiveError::Aborted`] ("the communication thread panicked: ...") and makes
/// the communicator unusable too; the thread goes on serving the later calls.
///
/// # Dropping
///
/// Dropping it runs the calls already issued to their end (each bounded by
/// [`CommOptions::timeout`](super::CommOptions::timeout) and
/// [`CommOptions::deadline`](super::CommOptions::deadline)), then joins the thread
/// and closes the communicator. To drain with a bound of your own, or to go on with
/// the blocking API, use [`into_inner`](BackgroundCommunicator::into_inner), whose
/// handle waits with a timeout like any other. To give up on a call in flight, raise
/// the communicator's [`Interrupt`](super::Interrupt).
///
/// # Examples
///
/// Two ranks as threads: rank 0 issues an allreduce, computes, and takes the sum
/// when it needs it.
///
/// ```
/// use switchyard::bootstrap::Bootstrap;
/// use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let endpoints: Vec<String> = (0..2).map(|r| format!("local://doc-background-{r}")).collect();
/// let ranks: Vec<_> = (0..2)
///     .map(|rank| {
///         let boot = Bootstrap::endpoints(rank, &endpoints);
///         std::thread::spawn(move || {
///             let mut comm = Communicator::join(&boot, CommOptions::default())?.into_background()?;
///             let grads = comm.allreduce(vec![rank as f32 + 1.0; 4], ReduceOp::Sum);
///             let busy: f32 = (1..100).map(|i| i as f32).sum(); // the backward pass
///             let grads = grads.wait()?;
///             Ok::<_, CollectiveError>((grads, busy))
///         })
///     })
///     .collect();
/// for rank in ranks {
///     let (grads, _) = rank.join().expect("rank thread")?;
///     assert_eq!(grads, [3.0; 4]);
/// }
/// # Ok(())
/// # }
/// ```
pub struct BackgroundCommunicator {
    rank: usize,
    size: usize,
    /// The thread's queue; `None` only while dropping.
    orders: Option<mpsc::Sender<Order>>,
    /// `None` once joined, or handed over by `into_inner`.
    thread: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for BackgroundCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundCommunicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// Moves this communicator onto a communication thread of its own, whose calls
    /// return at once (see [`BackgroundCommunicator`]).
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Setup`] if the thread cannot be started; the communicator
    /// is then closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use switchyard::collective::{Communicator, ReduceOp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut comm = Communicator::solo().into_background()?;
    /// let sums = comm.allreduce(vec![1u64, 2], ReduceOp::Sum);
    /// assert_eq!(sums.wait()?, [1, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_background(self) -> Result<BackgroundCommunicator, CollectiveError> {
        let (rank, size) = (self.rank, self.size);
        let (orders, queue) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("switchyard-comm-{rank}"))
            .spawn(move || serve(self, queue))
            .map_err(|e| {
                CollectiveError::setup(format!("starting rank {rank}'s communication thread"), e)
            })?;
        Ok(BackgroundCommunicator {
            rank,
            size,
            orders: Some(orders),
            thread: Some(thread),
        })
    }
}

/// The communication thread: runs the orders as they come, until the queue closes
/// or the communicator is asked back.
fn serve(mut comm: Communicator, queue: mpsc::Receiver<Order>) {
    for order in queue {
        match order {
            Order::Run(job) => job(&mut comm),
            Order::HandBack(done) => {
                done.finish(Ok(comm));
                return;
            }
        }
    }
}

impl BackgroundCommunicator {
    /// This process's rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// [`Communicator::allreduce`] of `buf`, which the handle gives back reduced.
    pub fn allreduce<T: Reducible>(&mut self, mut buf: Vec<T>, op: ReduceOp) -> Pending<Vec<T>> {
        self.submit(Call::Allreduce, move |comm| {
            comm.allreduce(&mut buf, op)?;
            Ok(buf)
        })
    }

    /// [`Communicator::broadcast`]: the handle gives back `buf` holding rank
    /// `root`'s.
    pub fn broadcast<T: Element>(&mut self, mut buf: Vec<T>, root: usize) -> Pending<Vec<T>> {
        self.submit(Call::Broadcast, move |comm| {
            comm.broadcast(&mut buf, root)?;
            Ok(buf)
        })
    }

    /// [`Communicator::broadcast_bytes`]: the handle gives back rank `root`'s bytes,
    /// whatever the length of `buf` on the other ranks.
    pub fn broadcast_bytes(&mut self, mut buf: Vec<u8>, root: usize) -> Pending<Vec<u8>> {
        self.submit(Call::Broadcast, move |comm| {
            comm.broadcast_bytes(&mut buf, root)?;
            Ok(buf)
        })
    }

    /// [`Communicator::allgather`]: the handle gives back every rank's `mine` (all
    /// of one length) in rank order, `world_size() * mine.len()` elements.
    ///
    /// ```
    /// use switchyard::collective::Communicator;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut comm = Communicator::solo().into_background()?;
    /// let all = comm.allgather(vec![7u32, 8]);
    /// assert_eq!(all.wait()?, [7, 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn allgather<T: Element>(&mut self, mine: Vec<T>) -> Pending<Vec<T>> {
        self.submit(Call::Allgather, move |comm| {
            let mut out = vec![<T as bytemuck::Zeroable>::zeroed(); comm.size * mine.len()];
            comm.allgather(&mine, &mut out)?;
            Ok(out)
        })
    }

    /// [`Communicator::reduce_scatter`]: the handle gives back `buf` and the range of
    /// it that holds this rank's block of the reduced result (the rest of `buf` is
    /// unspecified).
    pub fn reduce_scatter<T: Reducible>(
        &mut self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Pending<(Vec<T>, Range<usize>)> {
        self.submit(Call::ReduceScatter, move |comm| {
            let mine = comm.reduce_scatter(&mut buf, op)?;
            Ok((buf, mine))
        })
    }

    /// [`Communicator::barrier`]: the handle is done once every rank has reached it.
    pub fn barrier(&mut self) -> Pending<()> {
        self.submit(Call::Barrier, Communicator::barrier)
    }

    /// Any call of the blocking API, or several, in order with the others: `work`
    /// runs on the communication thread with the communicator, unless an earlier
    /// call made it unusable (then the handle returns
    /// [`CollectiveError::Poisoned`] and `work` does not run). `call` names the call
    /// in that error, and in the one of a panic in `work` (which makes the
    /// communicator unusable).
    ///
    /// # Examples
    ///
    /// A lazy allreduce whose `prepare` fails: its handle returns the failure, and
    /// the call after it is refused.
    ///
    /// ```
    /// use switchyard::collective::{Call, CollectiveError, Communicator, ReduceOp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut comm = Communicator::solo().into_background()?;
    /// let lazy = comm.submit(Call::Allreduce, |comm| {
    ///     let mut buf = [0u64; 2];
    ///     comm.try_allreduce_lazy(&mut buf, ReduceOp::Sum, |_| Err("no data"))?;
    ///     Ok(buf)
    /// });
    /// let next = comm.barrier();
    /// assert!(matches!(lazy.wait(), Err(CollectiveError::PrepareFailed { .. })));
    /// assert!(matches!(next.wait(), Err(CollectiveError::Poisoned { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn submit<R, F>(&mut self, call: Call, work: F) -> Pending<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut Communicator) -> Result<R, CollectiveError> + Send + 'static,
    {
        let (done, pending) = handle(call, self.rank);
        let job: Job = Box::new(move |comm| {
            // A poisoned communicator refuses the call before `work` sees it.
            let result = comm.usable(call).and_then(|()| {
                match panic::catch_unwind(AssertUnwindSafe(|| work(comm))) {
                    Ok(result) => result,
                    Err(panic) => {
                        let e = panicked(call, comm.rank, panic.as_ref());
                        comm.poison(&e);
                        Err(e)
                    }
                }
            });
            done.finish(result);
        });
        self.send(Order::Run(job));
        pending
    }

    /// Takes the communicator back once every call issued before has run: the
    /// handle gives it back, and the thread ends.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use switchyard::collective::{Communicator, ReduceOp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut comm = Communicator::solo().into_background()?;
    /// let _dropped = comm.allreduce(vec![1.5f64], ReduceOp::Max);
    /// let back = comm.into_inner();
    /// assert!(back.wait_timeout(Duration::from_secs(60)));
    /// let mut comm = back.wait()?;
    /// comm.barrier()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_inner(mut self) -> Pending<Communicator> {
        let (done, pending) = handle(Call::Setup, self.rank);
        self.send(Order::HandBack(done));
        // The thread ends as it hands the communicator over: nothing to join for.
        self.thread = None;
        pending
    }

    /// Queues `order`; if the thread is gone, dropping the order fills its handle
    /// with an error.
    fn send(&mut self, order: Order) {
        if let Some(orders) = &self.orders {
            let _gone: Result<(), _> = orders.send(order);
        }
    }
}

impl Drop for BackgroundCommunicator {
    fn drop(&mut self) {
        drop(self.orders.take());
        if let Some(thread) = self.thread.take() {
            // A panic out of a call is caught there and returned through its handle.
            let _ = thread.join();
        }
    }
}

/// The error of a call whose closure panicked on the communication thread.
fn panicked(call: Call, rank: usize, panic: &(dyn Any + Send)) -> CollectiveError {
    let what = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => text,
        (_, Some(text)) => text.as_str(),
        _ => "a panic without a message",
    };
    CollectiveError::Aborted {
        call,
        rank,
        reason: format!("the communication thread panicked: {what}"),
    }
}

/// A call issued to a [`BackgroundCommunicator`]: its result, once the
/// communication thread has run it.
///
/// Dropping a handle without waiting is fine: the call still runs, in its turn,
/// and its result is dropped.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard::collective::{Communicator, ReduceOp};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut comm = Communicator::solo().into_background()?;
/// let pending = comm.allreduce(vec![switchyard::half::bf16::from_f32(0.5)], ReduceOp::Sum);
/// while !pending.wait_timeout(Duration::from_millis(100)) {
///     // still running: log, or do something else
/// }
/// assert!(pending.is_done());
/// assert_eq!(pending.wait()?[0].to_f32(), 0.5);
/// # Ok(())
/// # }
/// ```
#[must_use = "a dropped handle's call still runs, but its result and error are lost"]
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
    call: Call,
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("call", &self.call)
            .field("done", &self.is_done())
            .finish()
    }
}

/// Where a call's result waits for its handle.
struct Slot<T> {
    result: Mutex<Option<Result<T, CollectiveError>>>,
    filled: Condvar,
}

impl<T> Slot<T> {
    fn lock(&self) -> MutexGuard<'_, Option<Result<T, CollectiveError>>> {
        self.result.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The communication thread's end of a handle: fills the slot once, with the
/// result, or on drop with the error of a call that never ran.
struct Done<T> {
    slot: Option<Arc<Slot<T>>>,
    call: Call,
    rank: usize,
}

impl<T> Done<T> {
    fn finish(mut self, result: Result<T, CollectiveError>) {
        if let Some(slot) = self.slot.take() {
            *slot.lock() = Some(result);
            slot.filled.notify_all();
        }
    }
}

impl<T> Drop for Done<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            *slot.lock() = Some(Err(CollectiveError::Aborted {
                call: self.call,
                rank: self.rank,
                reason: "the communication thread ended before the call ran".into(),
            }));
            slot.filled.notify_all();
        }
    }
}

/// A new call's two ends.
fn handle<T>(call: Call, rank: usize) -> (Done<T>, Pending<T>) {
    let slot = Arc::new(Slot {
        result: Mutex::new(None),
        filled: Condvar::new(),
    });
    let done = Done {
        slot: Some(slot.clone()),
        call,
        rank,
    };
    (done, Pending { slot, call })
}

impl<T> Pending<T> {
    /// Waits for the call to end and returns its result: the buffer, or what the
    /// call gives back, or its error. Waits as long as the call runs, which the
    /// communicator's own timeout and deadline bound; to wait less, see
    /// [`wait_timeout`](Pending::wait_timeout).
    pub fn wait(self) -> Result<T, CollectiveError> {
        let mut result = self.slot.lock();
        loop {
            if let Some(result) = result.take() {
                return result;
            }
            result = self
                .slot
                .filled
                .wait(result)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Whether the call has ended (then [`wait`](Pending::wait) returns at once).
    pub fn is_done(&self) -> bool {
        self.slot.lock().is_some()
    }

    /// Waits at most `timeout` for the call to end; true if it has, and then
    /// [`wait`](Pending::wait) returns at once. The handle stays usable either way.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        // A timeout past the end of the clock never expires.
        self.wait_until(Instant::now().checked_add(timeout))
    }

    /// [`wait_timeout`](Pending::wait_timeout) until `deadline`.
    pub fn wait_deadline(&self, deadline: Instant) -> bool {
        self.wait_until(Some(deadline))
    }

    fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let mut result = self.slot.lock();
        loop {
            if result.is_some() {
                return true;
            }
            let filled = &self.slot.filled;
            result = match deadline {
                None => filled.wait(result).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    match filled.wait_timeout(result, left) {
                        Ok((result, _)) => result,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
            };
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A call whose job is dropped unrun (the thread gone) fails its handle at once,
    /// naming the call and the rank, instead of leaving it to wait.
    #[test]
    fn a_call_the_thread_never_ran_fails_its_handle() {
        let (orders, queue) = mpsc::channel();
        drop(queue);
        let mut comm = BackgroundCommunicator {
            rank: 2,
            size: 3,
            orders: Some(orders),
            thread: None,
        };
        let pending = comm.allreduce(vec![1.0f32], ReduceOp::Sum);
        assert!(pending.is_done());
        let e = pending.wait().unwrap_err();
        assert_eq!(
            e.to_string(),
            "allreduce: rank 2 aborted the call: the communication thread ended before the call ran"
        );
        assert!(comm.into_inner().wait().is_err());
    }

    /// The words of a panic, whatever its payload.
    #[test]
    fn a_panic_reads_as_its_message() {
        let text = |payload: Box<dyn Any + Send>| panicked(Call::Barrier, 1, payload.as_ref());
        assert!(
            text(Box::new("static"))
                .to_string()
                .ends_with("panicked: static")
        );
        assert!(
            text(Box::new(String::from("owned")))
                .to_string()
                .ends_with("panicked: owned")
        );
        assert!(
            text(Box::new(7u8))
                .to_string()
                .ends_with("a panic without a message")
        );
    }
}
