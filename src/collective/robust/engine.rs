//! The recovery engine: a wrapper around the mesh engine that survives a rank's death.
//!
//! Ranks agree ([`state`](super::state)) on where each is, and each derives the same
//! [`Plan`]: a quick allreduce shows whether every rank is in the same call, and only
//! when they differ an allgather of every rank's state follows. Once an agreement
//! finds every rank in the same collective, calls run directly, without agreeing,
//! until the mesh breaks (every rank of a mesh switches at the same agreement). In a
//! job without failures the cost of robust mode is one copy per call: an allreduce
//! (and a reduce-scatter, which runs as one) runs into the buffer its result is kept
//! in, reading the input where the caller put it, and the result is copied to the
//! caller (the input stays untouched until the call succeeded, to run it again if
//! the mesh breaks half-way); other calls copy their input aside and keep a copy of
//! their result. Results are held until every rank is known to have passed the call,
//! and kept until the next checkpoint on [`Rules::keeps`] ranks.
//!
//! When the inner engine fails because a peer is gone, this rank drops the whole
//! mesh and forms a new one through the tracker (`recover`, same rank); the restarted
//! process joins with `start`, and the tracker gives it its rank back by task id.
//! The agreement then tells who is behind: a restarted rank first gets the last
//! checkpoint ([`Plan::Restore`]), then, call by call, the results survivors kept
//! ([`Plan::Replay`]), without running the calls (and without their `prepare`), until
//! every rank is in the same call again and it runs for real.

use super::mock::{self, KillPoint};
use super::state::{Kind, Plan, Rules, STATE_LEN, State, decide};
use super::store::{Global, Results, Saved, decode_local, encode_local};
use super::{Checkpoint, RobustOptions};
use crate::collective::element::{DType, ReduceOp};
use crate::collective::engine::{self, Collective, Elem, Engine};
use crate::collective::error::{Call, CollectiveError};
use crate::collective::signature::Signature;
use std::ops::Range;
use switchyard_msg::copy::copy_bytes;

/// Forms a new mesh for this rank after a failure (the tracker's `recover`).
pub(crate) type Rejoin = Box<dyn FnMut() -> Result<Box<dyn Engine>, CollectiveError> + Send>;

/// Reports a silent peer to the tracker (its `switchyard-silent` command, never a
/// `print`), whose events `switchyard launch`'s watchdog acts on
/// ([`crate::bootstrap::watchdog`]).
pub(crate) type Report = Box<dyn Fn(SilentReport<'_>) + Send>;

/// A peer this rank gave up on as silent, for the launcher's watchdog.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SilentReport<'a> {
    /// The silent rank.
    pub(crate) rank: usize,
    /// Its start number.
    pub(crate) attempt: u64,
    /// Why it counts as silent.
    pub(crate) reason: &'a str,
}

/// A lazy allreduce's closure that writes the call's input.
type Prepare<'r> = &'r mut engine::Prepare<'r>;

/// The call this rank is in, as the agreement loop sees it.
enum Pending<'r, 'a> {
    /// `load_checkpoint` of a process that has loaded nothing yet.
    Load,
    /// A collective; `prepare` fills its input first, when it runs for real.
    Call {
        request: &'r mut Collective<'a>,
        prepare: Option<Prepare<'r>>,
    },
    /// A checkpoint: `replicated` once the local models went round.
    Checkpoint {
        global: Global,
        local: Option<Vec<u8>>,
        replicated: bool,
    },
    /// `finalize`.
    Finish,
}

impl Pending<'_, '_> {
    fn kind(&self) -> Kind {
        match self {
            Pending::Load => Kind::Load,
            Pending::Call { .. } => Kind::Call,
            Pending::Checkpoint {
                replicated: false, ..
            } => Kind::Checkpoint,
            Pending::Checkpoint { .. } => Kind::Ack,
            Pending::Finish => Kind::Finish,
        }
    }
}

/// Whether `e` means the mesh is broken (a peer died, went silent, or gave up
/// because one did), so that rejoining can help; other errors are the caller's.
fn is_broken(e: &CollectiveError) -> bool {
    matches!(
        e,
        CollectiveError::PeerLost { .. }
            | CollectiveError::PeerTimeout { .. }
            | CollectiveError::Aborted { .. }
            | CollectiveError::DeadlineExceeded { .. }
            | CollectiveError::Transport { .. }
            | CollectiveError::Malformed { .. }
    )
}

/// Rabit's robust engine around a mesh engine.
pub(crate) struct RobustEngine {
    inner: Option<Box<dyn Engine>>,
    rejoin: Rejoin,
    rank: usize,
    world: usize,
    options: RobustOptions,
    rules: Rules,
    /// This process's restart count.
    attempt: u64,
    /// Nothing loaded and no call made since the process started.
    fresh: bool,
    saved: Saved,
    /// The checkpoint in progress, replicated, not yet committed.
    staged: Option<Saved>,
    results: Results,
    /// Calls made since the last checkpoint.
    seq: u64,
    /// Meshes formed after failures, for messages and tests.
    rejoins: u64,
    /// Where to report a silent rank, so that it is killed and restarted.
    report: Option<Report>,
    /// Every rank's start number, as of the last agreement.
    attempts: Vec<u64>,
    /// Silent ranks reported already, with their start numbers.
    reported: Vec<(usize, u64)>,
    /// The input of the call being run, kept to run it again (reused: a fresh
    /// allocation per call costs page faults at every large call).
    input: Vec<u8>,
    /// What this process saw of the versions, to say why a mock kill never fired.
    mock_history: mock::History,
    /// Whether calls run without an agreement first: set on every rank of a mesh at
    /// once, when an agreement finds every rank in the same collective; cleared when
    /// the mesh breaks (a new mesh starts with agreements, so that a restarted rank
    /// is heard).
    direct: bool,
}

impl RobustEngine {
    /// The engine over `inner` (this process's first mesh); `rejoin` forms the next
    /// one after a failure.
    pub(crate) fn new(
        inner: Box<dyn Engine>,
        rejoin: Rejoin,
        report: Option<Report>,
        options: RobustOptions,
    ) -> RobustEngine {
        let attempt = options.attempt;
        let (rank, world) = (inner.rank(), inner.world_size());
        RobustEngine {
            rules: Rules::new(world, options.global_replica, options.local_replica),
            inner: Some(inner),
            rejoin,
            rank,
            world,
            options,
            attempt,
            fresh: true,
            saved: Saved::default(),
            staged: None,
            results: Results::default(),
            seq: 0,
            rejoins: 0,
            report,
            attempts: vec![0; world],
            reported: Vec::new(),
            input: Vec::new(),
            mock_history: mock::History::default(),
            direct: false,
        }
    }

    /// Checkpoints committed.
    pub(crate) fn version(&self) -> u64 {
        self.saved.version
    }

    /// How many times this rank formed a new mesh after a failure.
    pub(crate) fn rejoins(&self) -> u64 {
        self.rejoins
    }

    /// `load_checkpoint`: the last committed checkpoint, from survivors when this
    /// process was restarted; `None` before the first.
    pub(crate) fn load(&mut self) -> Result<Option<Checkpoint>, CollectiveError> {
        if self.fresh {
            self.drive(&mut Pending::Load)?;
            self.fresh = false;
        }
        Ok(self.current())
    }

    /// `checkpoint` (and `lazy_checkpoint`, with a [`Global::Lazy`]).
    pub(crate) fn checkpoint(
        &mut self,
        global: Global,
        local: Option<Vec<u8>>,
    ) -> Result<(), CollectiveError> {
        self.strike(KillPoint::Call);
        self.drive(&mut Pending::Checkpoint {
            global,
            local,
            replicated: false,
        })?;
        self.fresh = false;
        Ok(())
    }

    fn current(&self) -> Option<Checkpoint> {
        let global = self.saved.global.as_ref()?;
        Some(Checkpoint {
            version: self.saved.version,
            global: global.bytes(),
            local: self.saved.locals.get(&self.rank).cloned().flatten(),
        })
    }

    fn strike(&mut self, point: KillPoint) {
        self.mock_history.began.get_or_insert(self.saved.version);
        mock::strike(
            &self.options.mock,
            self.rank,
            (self.saved.version, self.seq),
            self.attempt,
            point,
        );
    }

    fn state(&self, pending: &Pending<'_, '_>) -> State {
        let call = match pending {
            Pending::Call { request, .. } => [Signature::of(request).encode(), request.count()],
            _ => [0, 0],
        };
        State {
            kind: pending.kind(),
            fresh: self.fresh,
            has_local: self
                .saved
                .locals
                .get(&self.rank)
                .is_some_and(Option::is_some),
            version: self.saved.version,
            seq: self.seq,
            attempt: self.attempt,
            call,
            held_from: self.results.held_from(),
        }
    }

    /// The mesh, formed anew if the last one broke.
    fn engine(&mut self) -> Result<&mut Box<dyn Engine>, CollectiveError> {
        if self.inner.is_none() {
            let started = std::time::Instant::now();
            let engine = (self.rejoin)()?;
            self.rejoins += 1;
            tracing::info!(
                rank = self.rank,
                rejoins = self.rejoins,
                took = ?started.elapsed(),
                "robust: formed a new mesh after a failure"
            );
            self.inner = Some(engine);
            self.strike(KillPoint::Recover);
        }
        self.inner
            .as_mut()
            .ok_or_else(|| CollectiveError::InvalidArgument {
                call: Call::Recovery,
                reason: "no mesh".into(),
            })
    }

    /// Runs `request` on the mesh; a broken mesh is dropped (the next use rejoins).
    fn inner_run(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
        self.inner_call(|engine| engine.run(request))
    }

    /// Makes `call` on the mesh, as [`RobustEngine::inner_run`] runs a request.
    fn inner_call(
        &mut self,
        call: impl FnOnce(&mut dyn Engine) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let result = call(self.engine()?.as_mut());
        if let Err(e) = &result {
            if is_broken(e) {
                tracing::warn!(rank = self.rank, error = %e, "robust: mesh broken, rejoining");
                self.direct = false;
                // Closing a broken mesh waits for its peers' receipts of this rank's
                // abort notices (up to 300 ms, for dead peers too): off the path of
                // the recovery.
                if let Some(broken) = self.inner.take() {
                    let _ = std::thread::Builder::new()
                        .name("switchyard-drop-mesh".into())
                        .spawn(move || drop(broken));
                }
                self.report_silent(e);
            }
        }
        result
    }

    /// Tells the launcher's watchdog about a peer that went silent: unlike a dead
    /// one, it holds its rank until it is killed, and the new mesh cannot form.
    fn report_silent(&mut self, e: &CollectiveError) {
        let CollectiveError::PeerLost { rank, reason, .. } = e else {
            return;
        };
        if !reason.starts_with(crate::collective::link::SILENT) {
            return;
        }
        let attempt = self.attempts.get(*rank).copied().unwrap_or(0);
        if self.reported.contains(&(*rank, attempt)) {
            return;
        }
        self.reported.push((*rank, attempt));
        if let Some(report) = &self.report {
            report(SilentReport {
                rank: *rank,
                attempt,
                reason,
            });
        }
    }

    /// Agrees on a plan, rejoining as often as the mesh breaks under the agreement.
    fn agree(&mut self, pending: &Pending<'_, '_>) -> Result<Plan, CollectiveError> {
        let state = self.state(pending);
        let blocks: Vec<Range<usize>> = (0..self.world)
            .map(|r| r * STATE_LEN..(r + 1) * STATE_LEN)
            .collect();
        loop {
            match self.agree_quickly(&state) {
                Ok(Some(plan)) => return Ok(plan),
                Ok(None) => {}
                Err(e) if is_broken(&e) => continue,
                Err(e) => return Err(e),
            }
            let mut all = vec![0u8; STATE_LEN * self.world];
            all[blocks[self.rank].clone()].copy_from_slice(&state.encode());
            let mut request = Collective::Allgather {
                out: &mut all,
                width: 1,
                blocks: &blocks,
            };
            match self.inner_run(&mut request) {
                Ok(()) => {}
                Err(e) if is_broken(&e) => continue,
                Err(e) => return Err(e),
            }
            let states = blocks
                .iter()
                .enumerate()
                .map(|(r, b)| {
                    State::decode(&all[b.clone()]).map_err(|reason| CollectiveError::Malformed {
                        call: Call::Recovery,
                        rank: r,
                        reason,
                    })
                })
                .collect::<Result<Vec<State>, _>>()?;
            self.attempts = states.iter().map(|s| s.attempt).collect();
            return decide(&states, self.rules);
        }
    }

    /// The agreement of a job without failures, where every rank is in the same call:
    /// one allreduce (Max) of each field of the state and of its complement, which
    /// shows whether every rank's field is the same (the largest value equals the
    /// complement of the largest complement, i.e. the smallest value). Cheaper than
    /// the allgather of every state; `None` when the ranks differ, and the full
    /// agreement follows.
    fn agree_quickly(&mut self, state: &State) -> Result<Option<Plan>, CollectiveError> {
        let fields = [
            u64::from(state.kind.code()) | u64::from(state.fresh) << 8,
            state.version,
            state.seq,
            state.call[0],
            state.call[1],
        ];
        let mut words = [0u64; 2 * 5];
        for (i, field) in fields.iter().enumerate() {
            words[2 * i] = *field;
            words[2 * i + 1] = !*field;
        }
        self.inner_run(&mut Collective::Allreduce {
            buf: bytemuck::cast_slice_mut(&mut words),
            dtype: DType::U64,
            op: ReduceOp::Max,
        })?;
        let uniform = (0..fields.len()).all(|i| words[2 * i] == !words[2 * i + 1]);
        if !uniform {
            return Ok(None);
        }
        // Every rank is at this call: all passed the calls before it.
        if !state.fresh {
            self.results.settle(state.seq);
        }
        decide(&vec![*state; self.world], self.rules).map(Some)
    }

    /// Agrees and acts until `pending` is done.
    fn drive(&mut self, pending: &mut Pending<'_, '_>) -> Result<(), CollectiveError> {
        loop {
            let plan = self.agree(pending)?;
            // Every rank of the mesh derives the same plan, so all of them go direct
            // together, and stay direct until the mesh breaks.
            self.direct = plan == Plan::Run(Kind::Call);
            match self.act(plan, pending) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) if is_broken(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Carries out this rank's part of `plan`; `Ok(true)` when `pending` is done.
    fn act(&mut self, plan: Plan, pending: &mut Pending<'_, '_>) -> Result<bool, CollectiveError> {
        let me = self.rank;
        match plan {
            Plan::Run(Kind::Call) => {
                let Pending::Call { request, prepare } = pending else {
                    return Ok(false);
                };
                self.run_for_real(request, prepare)?;
                Ok(true)
            }
            Plan::Run(Kind::Checkpoint) | Plan::Replicate { .. } => {
                self.replicate(pending)?;
                Ok(false)
            }
            Plan::Run(Kind::Ack) => {
                self.commit();
                Ok(true)
            }
            Plan::Commit(ranks) => {
                if ranks.contains(&me) {
                    self.commit();
                    return Ok(true);
                }
                Ok(false)
            }
            Plan::Run(Kind::Finish) | Plan::Run(Kind::Load) => Ok(true),
            Plan::Restore {
                to,
                version,
                source,
                locals,
            } => {
                self.restore(&to, version, source, &locals)?;
                Ok(to.contains(&me))
            }
            Plan::Replay { seq, from, to, .. } => {
                let mut result = if me == from {
                    self.results.get(seq).map(<[u8]>::to_vec).ok_or_else(|| {
                        CollectiveError::InvalidArgument {
                            call: Call::Recovery,
                            reason: format!(
                                "rank {me} was to replay call {seq} but kept no result"
                            ),
                        }
                    })?
                } else {
                    Vec::new()
                };
                self.broadcast_vec(&mut result, from)?;
                if !to.contains(&me) {
                    return Ok(false);
                }
                let Pending::Call { request, .. } = pending else {
                    return Ok(false);
                };
                self.take_replayed(request, result)?;
                Ok(true)
            }
        }
    }

    /// A collective call: straight on the mesh while every rank is known to be in
    /// step (no failure since the last agreement found them in the same call), else,
    /// and after a failure in it, through the agreement.
    fn collective<'r>(
        &mut self,
        request: &'r mut Collective<'_>,
        mut prepare: Option<Prepare<'r>>,
    ) -> Result<(), CollectiveError> {
        self.strike(KillPoint::Call);
        if self.direct && self.inner.is_some() {
            match self.run_for_real(request, &mut prepare) {
                Ok(()) => return Ok(()),
                // The mesh broke: the input is back in the buffer (and `prepare`,
                // run already, is gone); the agreement takes over.
                Err(e) if is_broken(&e) => {}
                Err(e) => return Err(e),
            }
        }
        self.drive(&mut Pending::Call { request, prepare })
    }

    /// Runs a collective on the mesh, keeps its result, and moves to the next call.
    fn run_for_real(
        &mut self,
        request: &mut Collective<'_>,
        prepare: &mut Option<Prepare<'_>>,
    ) -> Result<(), CollectiveError> {
        if let Some(prepare) = prepare.take() {
            if let Err(reason) = prepare(request.result_buffer()) {
                return Err(self.prepare_failed(request.call(), reason));
            }
        }
        let call = request.call();
        match &mut *request {
            // Every rank keeps the whole reduction, so that any keeper can replay any
            // rank's block: reduce-scatter runs as an allreduce in robust mode.
            Collective::Allreduce { buf, dtype, op }
            | Collective::ReduceScatter { buf, dtype, op } => {
                self.reduce_and_keep(call, buf, *dtype, *op)?;
            }
            other => self.run_and_keep(other)?,
        }
        // A call that needs every rank's input (all but broadcast) shows that every
        // rank passed the calls before it.
        if !matches!(request, Collective::Broadcast { .. }) {
            self.results.settle(self.seq);
        }
        self.seq += 1;
        self.fresh = false;
        Ok(())
    }

    /// Runs an allreduce of `buf` into a buffer of the kept results, then copies the
    /// result into `buf`: the input stays in `buf` until the call has succeeded (to
    /// run it again if the mesh breaks half-way), and the result is kept without a
    /// copy of its own. On the host board this is one pass over the buffer fewer
    /// than copying the input aside, running in place and copying the result to keep
    /// (`docs/benchmarks/log.md`, "Robust mode: one copy per call").
    fn reduce_and_keep(
        &mut self,
        call: Call,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let mut result = self.results.buffer(buf.len());
        if let Err(e) =
            self.inner_call(|engine| engine.allreduce_into(buf, result.bytes_mut(), dtype, op))
        {
            self.results.give_back(result);
            return Err(e);
        }
        copy_bytes(buf, result.bytes());
        let (version, budget) = (self.saved.version, self.options.result_budget);
        let for_good = self.rules.keeps(self.rank, self.seq);
        self.results
            .keep_buffer(call, (self.seq, for_good), result, budget, version)
    }

    /// Runs any other call in place with a copy of its input aside (put back if the
    /// mesh breaks half-way), and keeps a copy of its result.
    fn run_and_keep(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
        let mut input = std::mem::take(&mut self.input);
        let source = request.result_buffer();
        // Resized, not cleared: a buffer of the same length is not written twice.
        input.resize(source.len(), 0);
        copy_bytes(&mut input, source);
        let outcome = self.inner_run(request);
        if let Err(e) = outcome {
            restore_input(request, &input);
            self.input = input;
            return Err(e);
        }
        self.input = input;
        self.keep_result(request)
    }

    /// Holds this call's result for replay (for good where [`Rules::keeps`] says so).
    fn keep_result(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
        let (version, budget) = (self.saved.version, self.options.result_budget);
        let for_good = self.rules.keeps(self.rank, self.seq);
        self.results.keep(
            request.call(),
            (self.seq, for_good),
            &*request.result_buffer(),
            budget,
            version,
        )
    }

    /// Takes a result replayed by a survivor as this call's.
    fn take_replayed(
        &mut self,
        request: &mut Collective<'_>,
        result: Vec<u8>,
    ) -> Result<(), CollectiveError> {
        let call = request.call();
        match &mut *request {
            Collective::Fold {
                buf,
                elem: Elem::Bytes,
                ..
            } => **buf = result,
            other => {
                let out = other.result_buffer();
                if out.len() != result.len() {
                    return Err(CollectiveError::Disagree {
                        call,
                        reason: format!(
                            "the replayed result has {} bytes, this rank's buffer {}",
                            result.len(),
                            out.len()
                        ),
                    });
                }
                out.copy_from_slice(&result);
            }
        }
        self.keep_result(request)?;
        tracing::debug!(
            rank = self.rank,
            seq = self.seq,
            "robust: call replayed from a survivor"
        );
        self.seq += 1;
        self.fresh = false;
        Ok(())
    }

    /// Sends every local model round (an allgather of tagged records) and stages the
    /// checkpoint with the copies this rank holds.
    fn replicate(&mut self, pending: &mut Pending<'_, '_>) -> Result<(), CollectiveError> {
        let (global, own) = match pending {
            Pending::Checkpoint { global, local, .. } => {
                (global.clone(), encode_local(local.as_deref()))
            }
            _ => return Ok(()),
        };
        let n = self.world;
        let mut lengths = vec![0u8; 8 * n];
        lengths[8 * self.rank..8 * self.rank + 8]
            .copy_from_slice(&(own.len() as u64).to_le_bytes());
        let blocks: Vec<Range<usize>> = (0..n).map(|r| 8 * r..8 * r + 8).collect();
        self.inner_run(&mut Collective::Allgather {
            out: &mut lengths,
            width: 1,
            blocks: &blocks,
        })?;
        let mut offsets = Vec::with_capacity(n);
        let mut at = 0usize;
        for r in 0..n {
            let mut word = [0u8; 8];
            word.copy_from_slice(&lengths[8 * r..8 * r + 8]);
            let len = usize::try_from(u64::from_le_bytes(word)).unwrap_or(usize::MAX);
            let end = at
                .checked_add(len)
                .ok_or_else(|| CollectiveError::Malformed {
                    call: Call::Checkpoint,
                    rank: r,
                    reason: format!("a local model of {len} bytes"),
                })?;
            offsets.push(at..end);
            at = end;
        }
        let mut all = vec![0u8; at];
        all[offsets[self.rank].clone()].copy_from_slice(&own);
        self.inner_run(&mut Collective::Allgather {
            out: &mut all,
            width: 1,
            blocks: &offsets,
        })?;
        let mut staged = Saved {
            version: self.saved.version + 1,
            global: Some(global),
            locals: Default::default(),
        };
        for k in 0..=self.rules.local_replica {
            let owner = (self.rank + n - k) % n;
            let record = decode_local(&all[offsets[owner].clone()]).map_err(|reason| {
                CollectiveError::Malformed {
                    call: Call::Checkpoint,
                    rank: owner,
                    reason,
                }
            })?;
            staged.locals.insert(owner, record);
        }
        self.staged = Some(staged);
        if let Pending::Checkpoint { replicated, .. } = pending {
            *replicated = true;
        }
        self.strike(KillPoint::Replicate);
        Ok(())
    }

    /// Makes the staged checkpoint the committed one.
    fn commit(&mut self) {
        self.mock_history
            .checkpoints
            .push((self.saved.version, self.seq));
        if let Some(staged) = self.staged.take() {
            self.saved = staged;
        }
        self.results.clear();
        self.seq = 0;
        tracing::debug!(
            rank = self.rank,
            version = self.saved.version,
            "robust: checkpoint committed"
        );
    }

    /// Sends checkpoint `version` to the restarted ranks `to`: the global model from
    /// `source`, each local model from its holder.
    fn restore(
        &mut self,
        to: &[usize],
        version: u64,
        source: Option<usize>,
        locals: &[(usize, usize)],
    ) -> Result<(), CollectiveError> {
        let me = self.rank;
        let taking = to.contains(&me);
        let Some(source) = source else {
            return Ok(());
        };
        let mut global = if me == source {
            self.saved
                .global
                .as_ref()
                .map(Global::bytes)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        self.broadcast_vec(&mut global, source)?;
        let mut received = Saved {
            version,
            global: Some(Global::Bytes(global.into())),
            locals: Default::default(),
        };
        for &(owner, holder) in locals {
            let mut record = if me == holder {
                encode_local(self.saved.locals.get(&owner).cloned().flatten().as_deref())
            } else {
                Vec::new()
            };
            self.broadcast_vec(&mut record, holder)?;
            let holds = (0..=self.rules.local_replica).any(|k| (owner + k) % self.world == me);
            if taking && holds {
                let model = decode_local(&record).map_err(|reason| CollectiveError::Malformed {
                    call: Call::LoadCheckpoint,
                    rank: holder,
                    reason,
                })?;
                received.locals.insert(owner, model);
            }
        }
        if taking {
            self.saved = received;
            self.results.clear();
            self.seq = 0;
        }
        Ok(())
    }

    /// A byte string from `root` to every rank: its length, then the bytes.
    fn broadcast_vec(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<(), CollectiveError> {
        let mut len = (buf.len() as u64).to_le_bytes();
        self.inner_run(&mut Collective::Broadcast {
            buf: &mut len,
            elem: Elem::Bytes,
            root,
        })?;
        let len =
            usize::try_from(u64::from_le_bytes(len)).map_err(|_| CollectiveError::Malformed {
                call: Call::Recovery,
                rank: root,
                reason: "a length past this machine's memory".into(),
            })?;
        buf.resize(len, 0);
        self.inner_run(&mut Collective::Broadcast {
            buf,
            elem: Elem::Bytes,
            root,
        })
    }
}

/// Puts a request's input back after a failed attempt.
fn restore_input(request: &mut Collective<'_>, input: &[u8]) {
    match request {
        Collective::Fold {
            buf,
            elem: Elem::Bytes,
            ..
        } => {
            buf.clear();
            buf.extend_from_slice(input);
        }
        other => {
            let out = other.result_buffer();
            if out.len() == input.len() {
                copy_bytes(out, input);
            }
        }
    }
}

impl Engine for RobustEngine {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn name(&self) -> &'static str {
        "robust"
    }

    fn run(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
        self.collective(request, None)
    }

    fn run_prepared(
        &mut self,
        request: &mut Collective<'_>,
        prepare: &mut engine::Prepare<'_>,
    ) -> Result<(), CollectiveError> {
        self.collective(request, Some(prepare))
    }

    /// Ends a call whose `prepare` failed here: the mesh tells the peers (their
    /// calls fail and they recover, as after any aborted call, keeping no result of
    /// it), and this rank leaves that mesh too, so that a later call of its own
    /// rejoins them through the agreement. The error goes to the caller: no
    /// recovery can make up for an input that could not be computed.
    fn prepare_failed(&mut self, call: Call, reason: String) -> CollectiveError {
        let e = match self.inner.as_mut() {
            Some(inner) => inner.prepare_failed(call, reason),
            None => CollectiveError::PrepareFailed {
                call,
                rank: self.rank,
                reason,
            },
        };
        self.direct = false;
        if let Some(broken) = self.inner.take() {
            // As in `inner_run`: closing waits for the receipts of the notice.
            let _ = std::thread::Builder::new()
                .name("switchyard-drop-mesh".into())
                .spawn(move || drop(broken));
        }
        e
    }

    /// After a failed `prepare` only: this rank left the mesh, its peers recover
    /// without a result of the call, and the next call of any rank runs through the
    /// agreement, which compares every rank's call number, signature and length
    /// before any data moves. Every other failure that reaches the caller leaves
    /// the ranks where it found them.
    fn usable_after(&self, e: &CollectiveError) -> bool {
        matches!(e, CollectiveError::PrepareFailed { .. })
    }

    fn robust(&mut self) -> Option<&mut RobustEngine> {
        Some(self)
    }

    fn finish(&mut self) -> Result<(), CollectiveError> {
        self.drive(&mut Pending::Finish)?;
        // The job is over for this rank: a mock kill aimed at it that has not struck
        // never will, and a test that counted on it would pass for the wrong reason.
        let history = &mut self.mock_history;
        history.ended = Some((self.saved.version, self.seq));
        for warning in mock::never_fired(
            &self.options.mock,
            (self.rank, self.world),
            self.attempt,
            history,
        ) {
            mock::warn(self.rank, self.attempt, &warning);
        }
        Ok(())
    }
}
