//! The stable driver: mutates a target's corpus for a number of iterations or until a
//! deadline, catching the first panic as a finding.

use crate::mutate::{mutate, Rng};
use crate::Target;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

/// How long one target runs: whichever limit comes first.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Most mutated inputs to run.
    pub iterations: u64,
    /// When to stop, if at all.
    pub deadline: Option<Instant>,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Inputs run, corpus replay included.
    pub executions: u64,
    /// Distinct outcome labels seen.
    pub labels: usize,
    /// Size of the working corpus at the end (the given entries plus the inputs that
    /// brought a new label).
    pub corpus: usize,
}

/// An input that made the target panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The input.
    pub input: Vec<u8>,
    /// The panic message.
    pub message: String,
}

/// Runs `target` on every entry of `corpus`, then on mutations of them until
/// `budget` runs out. An input whose outcome label is new joins the working corpus,
/// so inputs that got further into the decoder are mutated further. Stops at the first
/// panic and returns the input.
pub fn run(
    target: &Target,
    corpus: &[Vec<u8>],
    seed: u64,
    budget: Budget,
) -> Result<Report, Finding> {
    let mut working: Vec<Vec<u8>> = corpus.to_vec();
    if working.is_empty() {
        working.push(Vec::new());
    }
    let mut labels = HashSet::new();
    let mut executions = 0u64;
    let execute = |input: &[u8]| -> Result<String, Finding> {
        catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|panic| Finding {
            input: input.to_vec(),
            message: panic_message(panic.as_ref()),
        })
    };
    for input in &working {
        labels.insert(execute(input)?);
        executions += 1;
    }
    let mut rng = Rng::new(seed);
    let mut input = Vec::new();
    for iteration in 0..budget.iterations {
        // Checking the clock every input would cost more than the fastest targets.
        if iteration % 256 == 0 && budget.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        input.clear();
        input.extend_from_slice(&working[rng.index(working.len())]);
        let other = &working[rng.index(working.len())];
        mutate(&mut rng, &mut input, other, target.max_len);
        let outcome = execute(&input)?;
        executions += 1;
        if labels.insert(outcome) {
            working.push(input.clone());
        }
    }
    Ok(Report {
        executions,
        labels: labels.len(),
        corpus: working.len(),
    })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}
