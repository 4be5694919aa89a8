//! `switchyard._native.Comm`: one [`Communicator`], driven from Python.
//!
//! Every call releases the GIL while it communicates and watches for Ctrl-C
//! (`sigint.rs`). A communicator serves one thread at a time, as MPI's and rabit's
//! do: a second thread that calls while the first is inside a call gets an error
//! instead of waiting (waiting with the GIL could deadlock a `prepare_fun`).

use crate::buffer::View;
use crate::errors::{finalized, to_py, SwitchyardError};
use crate::sigint::{self, Watch};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;
use std::sync::{mpsc, Mutex};
use std::time::Duration;
use switchyard::bootstrap::{Bootstrap, UniqueId};
use switchyard::collective::{
    CollectiveError, CommOptions, Communicator, DType, ReduceOp, RobustOptions,
};

/// How often a waiting `init` looks at Python's signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// A checkpoint as Python sees it: version, global model, local model.
type LoadedCheckpoint = (u64, Py<PyByteArray>, Option<Py<PyByteArray>>);

/// One communicator (`None` once finalized).
#[pyclass(module = "switchyard._native", name = "Comm")]
#[derive(Debug)]
pub(crate) struct Comm {
    inner: Mutex<Option<Communicator>>,
    rank: usize,
    world: usize,
    host: String,
    robust: bool,
    engine: &'static str,
}

/// A reduction operation from its name.
fn op_of(name: &str) -> PyResult<ReduceOp> {
    Ok(match name {
        "sum" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "bitor" => ReduceOp::BitOr,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown reduction {other:?}: use switchyard.SUM, PROD, MAX, MIN or BITOR"
            )))
        }
    })
}

/// Options from the environment, with the Ctrl-C flag and an optional timeout.
fn options(timeout: Option<f64>) -> PyResult<CommOptions> {
    let mut options = CommOptions::from_env()
        .map_err(|e| PyValueError::new_err(e.to_string()))?
        .with_interrupt(sigint::interrupt().clone());
    if let Some(secs) = timeout {
        let t = Duration::try_from_secs_f64(secs)
            .map_err(|e| PyValueError::new_err(format!("timeout {secs}: {e}")))?;
        options = options.with_timeout(t);
    }
    Ok(options)
}

/// Runs `setup` on a thread of its own while this one looks at Python's signals, so
/// that Ctrl-C while a rank waits for the others to join raises `KeyboardInterrupt`
/// (the setup thread then gives up at its own timeout and its half-formed
/// communicator is dropped).
fn form(
    py: Python<'_>,
    robust: bool,
    setup: impl FnOnce() -> Result<Communicator, CollectiveError> + Send + 'static,
) -> PyResult<Comm> {
    let (tx, rx) = mpsc::channel();
    // Shared with the GIL-free waits below, which need a `Sync` receiver.
    let rx = Mutex::new(rx);
    std::thread::Builder::new()
        .name("switchyard-init".into())
        .spawn(move || {
            let _ = tx.send(setup());
        })
        .map_err(|e| SwitchyardError::new_err(format!("init: cannot start a thread: {e}")))?;
    loop {
        match py.allow_threads(|| {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv_timeout(SIGNAL_POLL)
        }) {
            Ok(result) => {
                let comm = result.map_err(to_py)?;
                return Ok(Comm {
                    engine: comm.engine_name(),
                    rank: comm.rank(),
                    world: comm.world_size(),
                    host: comm.processor_name().to_string(),
                    inner: Mutex::new(Some(comm)),
                    robust,
                });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(SwitchyardError::new_err("init: the setup thread panicked"))
            }
        }
    }
}

impl Comm {
    /// Runs `f` on the communicator with the GIL released and Ctrl-C watched.
    fn call<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Communicator) -> Result<R, CollectiveError> + Send,
    ) -> PyResult<R> {
        let mut guard = self.inner.try_lock().map_err(|_| {
            SwitchyardError::new_err(
                "this communicator is already inside a call: one on another thread (one thread \
                 at a time, as with MPI), or the one whose prepare_fun is running (a \
                 prepare_fun cannot call collectives)",
            )
        })?;
        let comm = guard.as_mut().ok_or_else(finalized)?;
        let watch = Watch::start();
        let result = py.allow_threads(|| f(comm));
        drop(watch);
        if sigint::interrupt().is_raised() {
            // Python noted the signal too: its handler raises KeyboardInterrupt (or
            // whatever the program installed) here.
            py.check_signals()?;
        }
        result.map_err(to_py)
    }

    /// Checks that `view` holds `dtype` elements for `call`, which moves them.
    fn same_dtype(view: &View, dtype: DType, call: &str, what: &str) -> PyResult<()> {
        let theirs = view.moved_as(call)?;
        if theirs != dtype {
            return Err(PyValueError::new_err(format!(
                "{call}: {what} holds {theirs:?} elements, the input {dtype:?}"
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl Comm {
    /// A communicator from the environment: `switchyard launch`, a tracker's DMLC_*
    /// variables, torchrun's, `mpirun`'s or `srun`'s, or a world of one when none is
    /// set. `robust` joins the tracker in robust mode; `args` may hold `mock=...`.
    #[staticmethod]
    #[pyo3(signature = (robust=false, args=Vec::new(), timeout=None))]
    fn from_env(
        py: Python<'_>,
        robust: bool,
        args: Vec<String>,
        timeout: Option<f64>,
    ) -> PyResult<Comm> {
        let mut options = options(timeout)?;
        if robust {
            let robust_options = RobustOptions::from_env()
                .map_err(|e| e.to_string())
                .and_then(|r| r.with_args(args))
                .map_err(|e| PyValueError::new_err(format!("init: {e}")))?;
            options = options.with_robust(robust_options);
        }
        form(py, robust, move || match Bootstrap::from_env() {
            Ok(Some(boot)) => Communicator::join(&boot, options),
            // Robust mode without a tracker: `join` refuses it, naming the variables.
            Ok(None) if robust => Communicator::join(&Bootstrap::solo(), options),
            // Started by hand (a world of one, announced once on stderr) or a malformed
            // environment (its error): as the core's `from_env` reports either, and a
            // world of one never waits, so the options do not matter.
            _ => Communicator::from_env(),
        })
    }

    /// Rank `rank` of `world` from a unique id that rank 0 made with `new_unique_id`.
    #[staticmethod]
    #[pyo3(signature = (unique_id, rank, world, timeout=None))]
    fn from_unique_id(
        py: Python<'_>,
        unique_id: &str,
        rank: usize,
        world: usize,
        timeout: Option<f64>,
    ) -> PyResult<Comm> {
        let id: UniqueId = unique_id
            .parse()
            .map_err(|e| PyValueError::new_err(format!("init: unique id {unique_id:?}: {e}")))?;
        let options = options(timeout)?;
        form(py, false, move || {
            Communicator::from_unique_id(&id, rank, world, options)
        })
    }

    /// A world of one.
    #[staticmethod]
    fn solo() -> Comm {
        let comm = Communicator::solo();
        Comm {
            engine: comm.engine_name(),
            rank: 0,
            world: 1,
            host: comm.processor_name().to_string(),
            inner: Mutex::new(Some(comm)),
            robust: false,
        }
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.world
    }

    /// The engine: "mesh", "mpi", "robust" or "solo".
    #[getter]
    fn engine(&self) -> &'static str {
        self.engine
    }

    /// Whether this communicator is in robust mode (checkpoints, recovery).
    #[getter]
    fn robust(&self) -> bool {
        self.robust
    }

    /// The host this rank runs on.
    #[getter]
    fn processor_name(&self) -> &str {
        &self.host
    }

    /// Whether other processes take part.
    fn is_distributed(&self, py: Python<'_>) -> PyResult<bool> {
        self.call(py, |c| Ok(c.is_distributed()))
    }

    /// Reduces `buf` in place over all ranks; `prepare(buf)` fills it first, and is
    /// not called when robust mode recovers the result. When `prepare` raises, the
    /// call runs on no rank: its exception is raised here, and the other ranks' calls
    /// fail naming this rank and "prepare failed" (none computes a result without
    /// this rank's input). As after any failed call, every rank's `Comm` then raises
    /// "this communicator is unusable after an earlier call failed" for every later
    /// call: make a new one to go on (in robust mode the failing rank's stays usable,
    /// and its next call must be this allreduce again).
    ///
    /// `dtype="bfloat16"` reduces a uint16 array as the bfloat16 numbers its bits
    /// are; float16 and bfloat16 sum in float32 and round once per element.
    #[pyo3(signature = (buf, op, prepare=None, dtype=None))]
    fn allreduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        prepare: Option<PyObject>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let call = "allreduce";
        let op = op_of(op)?;
        let mut view = View::borrow(buf, call, false)?;
        let dtype = view.reduced_as(call, dtype)?;
        let Some(prepare) = prepare else {
            let bytes = view.bytes_mut();
            return self.call(py, move |c| c.allreduce_raw(bytes, dtype, op));
        };
        let array: PyObject = buf.clone().unbind();
        let mut failed: Option<PyErr> = None;
        let failed_ref = &mut failed;
        let bytes = view.bytes_mut();
        let result = self.call(py, move |c| {
            c.try_allreduce_lazy_raw(bytes, dtype, op, |_same_memory| {
                // Python writes the array, whose memory the engine lent to this
                // closure and reads only after it returns.
                Python::with_gil(|py| match prepare.call1(py, (array,)) {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        // The peers are told the exception in words; this rank raises
                        // the exception itself.
                        let words = e.to_string();
                        *failed_ref = Some(e);
                        Err(words)
                    }
                })
            })
        });
        match failed {
            Some(e) => Err(e),
            None => result,
        }
    }

    /// Copies `root`'s `buf` into every rank's `buf` in place (same length everywhere).
    /// The root's buffer may be read-only (it is copied once then).
    fn broadcast_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, root: usize) -> PyResult<()> {
        let call = "broadcast";
        let read_only_ok = root == self.rank;
        let mut view = View::borrow(buf, call, read_only_ok)?;
        if view.is_read_only() {
            let mut copy = view.bytes().to_vec();
            return self.call(py, move |c| c.broadcast_raw(&mut copy, DType::U8, root));
        }
        let bytes = view.bytes_mut();
        self.call(py, move |c| c.broadcast_raw(bytes, DType::U8, root))
    }

    /// Copies `root`'s bytes to every rank: the root passes any bytes-like object and
    /// gets `None`; the others pass `None` and get a `bytearray`.
    #[pyo3(signature = (data, root))]
    fn broadcast_bytes(
        &self,
        py: Python<'_>,
        data: Option<&Bound<'_, PyAny>>,
        root: usize,
    ) -> PyResult<Option<Py<PyByteArray>>> {
        let call = "broadcast";
        let mut bytes = match (root == self.rank, data) {
            (true, Some(d)) => View::borrow(d, call, true)?.bytes().to_vec(),
            (true, None) => {
                return Err(PyValueError::new_err(format!(
                    "{call}: the root passes no data"
                )))
            }
            (false, _) => Vec::new(),
        };
        let is_root = root == self.rank;
        let bytes = self.call(py, move |c| {
            c.broadcast_bytes(&mut bytes, root).map(|()| bytes)
        })?;
        Ok((!is_root).then(|| PyByteArray::new(py, &bytes).unbind()))
    }

    /// Gathers every rank's `mine` into `out` (world_size times as long), in rank order.
    fn allgather(
        &self,
        py: Python<'_>,
        mine: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let call = "allgather";
        let mine = View::borrow(mine, call, true)?;
        let mut out = View::borrow(out, call, false)?;
        let dtype = mine.moved_as(call)?;
        Comm::same_dtype(&out, dtype, call, "out")?;
        let out = out.bytes_mut();
        // A rank's part may lie inside the output (torch's all_gather_into_tensor
        // passes a slice of it): then it is copied first, since the call writes the
        // output while it reads the part. Apart, it is read where it is (a copy of
        // 32 MiB cost more than the call's own copying).
        let apart = mine.bytes().as_ptr_range().end <= out.as_ptr_range().start
            || out.as_ptr_range().end <= mine.bytes().as_ptr_range().start;
        if apart {
            let mine = mine.bytes();
            return self.call(py, move |c| c.allgather_raw(mine, out, dtype));
        }
        let mine = mine.bytes().to_vec();
        self.call(py, move |c| c.allgather_raw(&mine, out, dtype))
    }

    /// Reduces `buf` over all ranks and leaves this rank's block of the result in
    /// place; returns the block's element range `(start, end)`. `dtype` as for
    /// `allreduce`.
    #[pyo3(signature = (buf, op, dtype=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<(usize, usize)> {
        let call = "reduce_scatter";
        let op = op_of(op)?;
        let mut view = View::borrow(buf, call, false)?;
        let dtype = view.reduced_as(call, dtype)?;
        let bytes = view.bytes_mut();
        let range = self.call(py, move |c| c.reduce_scatter_raw(bytes, dtype, op))?;
        Ok((range.start, range.end))
    }

    /// Returns once every rank has called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, |c| c.barrier())
    }

    /// Prints `text` in the tracker's log (on stderr without a tracker).
    fn tracker_print(&self, py: Python<'_>, text: &str) -> PyResult<()> {
        let text = text.to_string();
        self.call(py, move |c| c.tracker_print(&text))
    }

    /// Commits a checkpoint: the global model's bytes and this rank's local model's.
    #[pyo3(signature = (global_model, local_model=None))]
    fn checkpoint(
        &self,
        py: Python<'_>,
        global_model: &Bound<'_, PyAny>,
        local_model: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let call = "checkpoint";
        let global = View::borrow(global_model, call, true)?;
        let local = local_model
            .map(|l| View::borrow(l, call, true))
            .transpose()?;
        let global_bytes = global.bytes();
        let local_bytes = local.as_ref().map(View::bytes);
        self.call(py, move |c| c.checkpoint(global_bytes, local_bytes))
    }

    /// The last checkpoint: `None` on a fresh start, else `(version, global,
    /// local)` with the models as `bytearray`s (`local` may be `None`).
    fn load_checkpoint(&self, py: Python<'_>) -> PyResult<Option<LoadedCheckpoint>> {
        let found = self.call(py, |c| c.load_checkpoint())?;
        Ok(found.map(|cp| {
            (
                cp.version,
                PyByteArray::new(py, &cp.global).unbind(),
                cp.local.map(|l| PyByteArray::new(py, &l).unbind()),
            )
        }))
    }

    /// Checkpoints committed so far.
    fn version_number(&self, py: Python<'_>) -> PyResult<u64> {
        self.call(py, |c| Ok(c.version_number()))
    }

    /// How many times this rank formed a new mesh after a failure.
    fn recoveries(&self, py: Python<'_>) -> PyResult<u64> {
        self.call(py, |c| Ok(c.recoveries()))
    }

    /// Closes the communicator (robust mode: after a last agreement, so that no
    /// restarted rank is left waiting); later calls raise.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        let comm = {
            let mut guard = self.inner.try_lock().map_err(|_| {
                SwitchyardError::new_err(
                    "finalize: the communicator is inside a call on another thread",
                )
            })?;
            guard.take()
        };
        let Some(comm) = comm else {
            return Ok(());
        };
        let watch = Watch::start();
        let result = py.allow_threads(move || comm.finalize());
        drop(watch);
        if sigint::interrupt().is_raised() {
            py.check_signals()?;
        }
        result.map_err(to_py)
    }

    /// Whether `finalize` was called. Never waits: a communicator inside a call on
    /// another thread is not finalized (waiting for it with the GIL held could
    /// deadlock a `prepare` that needs the GIL).
    #[getter]
    fn finalized(&self) -> bool {
        match self.inner.try_lock() {
            Ok(guard) => guard.is_none(),
            Err(std::sync::TryLockError::WouldBlock) => false,
            Err(std::sync::TryLockError::Poisoned(_)) => true,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<switchyard Comm rank {} of {}, {} engine>",
            self.rank, self.world, self.engine
        )
    }
}

/// A new unique id for `Comm.from_unique_id`, on this host (rank 0 makes it).
#[pyfunction]
pub(crate) fn new_unique_id() -> PyResult<String> {
    UniqueId::new()
        .map(|id| id.to_string())
        .map_err(|e| SwitchyardError::new_err(format!("new_unique_id: {e}")))
}
