//! The root's decisions about check-ins, without sockets.

/// What the root decides about one check-in (the sans-IO part of the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Wrong tag: close the connection without an answer.
    Close,
    /// Answer with this status (1 duplicate, 2 wrong world, 3 bad rank) and reason.
    Refuse(u32, String),
    /// Accepted; wait for the others.
    Wait,
    /// Accepted and it was the last: answer everyone with these successor addresses
    /// (index: rank).
    Complete(Vec<String>),
}

/// The root's bookkeeping: which rank checked in with which ring address.
#[derive(Debug)]
pub(crate) struct RootState {
    tag: u64,
    world: u32,
    ring: Vec<Option<String>>,
}

impl RootState {
    /// A root for job `tag` of `world` ranks.
    pub(crate) fn new(tag: u64, world: u32) -> RootState {
        RootState {
            tag,
            world,
            ring: vec![None; world as usize],
        }
    }

    /// Decides about one check-in.
    pub(crate) fn check_in(
        &mut self,
        tag: u64,
        rank: u32,
        world: u32,
        ring_addr: String,
    ) -> Verdict {
        if tag != self.tag {
            return Verdict::Close;
        }
        if world != self.world {
            return Verdict::Refuse(2, format!("the root's world size is {}", self.world));
        }
        let Some(slot) = self.ring.get_mut(rank as usize) else {
            return Verdict::Refuse(3, format!("rank {rank} is outside a world of {world}"));
        };
        if let Some(first) = slot {
            return Verdict::Refuse(1, format!("rank {rank} already checked in (ring {first})"));
        }
        *slot = Some(ring_addr);
        if self.ring.iter().any(Option::is_none) {
            return Verdict::Wait;
        }
        let all: Vec<String> = self.ring.iter().flatten().cloned().collect();
        let n = all.len();
        Verdict::Complete((0..n).map(|r| all[(r + 1) % n].clone()).collect())
    }

    /// Ranks not checked in yet.
    pub(crate) fn missing(&self) -> Vec<u32> {
        (0..self.world)
            .filter(|&r| self.ring[r as usize].is_none())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_state_refuses_and_completes() {
        let mut s = RootState::new(7, 3);
        assert_eq!(s.check_in(8, 0, 3, "a".into()), Verdict::Close);
        assert!(matches!(
            s.check_in(7, 0, 4, "a".into()),
            Verdict::Refuse(2, _)
        ));
        assert!(matches!(
            s.check_in(7, 3, 3, "a".into()),
            Verdict::Refuse(3, _)
        ));
        assert_eq!(s.check_in(7, 1, 3, "b".into()), Verdict::Wait);
        assert!(matches!(
            s.check_in(7, 1, 3, "x".into()),
            Verdict::Refuse(1, _)
        ));
        assert_eq!(s.missing(), vec![0, 2]);
        assert_eq!(s.check_in(7, 2, 3, "c".into()), Verdict::Wait);
        assert_eq!(
            s.check_in(7, 0, 3, "a".into()),
            Verdict::Complete(vec!["b".into(), "c".into(), "a".into()])
        );
    }
}
