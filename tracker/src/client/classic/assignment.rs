//! The assignment message of the classic rabit protocol, checked: a rank inside the
//! world, neighbours that are other ranks of it, a parent among the tree neighbours.

use std::collections::BTreeSet;

/// A checked assignment message.
#[derive(Debug)]
pub(super) struct Assignment {
    pub(super) rank: u32,
    pub(super) world: u32,
    pub(super) parent: Option<u32>,
    pub(super) tree: Vec<u32>,
    pub(super) prev: Option<u32>,
    pub(super) next: Option<u32>,
    pub(super) link_set: BTreeSet<u32>,
}

impl Assignment {
    pub(super) fn check(
        rank: i32,
        parent: i32,
        world: i32,
        tree: Vec<i32>,
        prev: i32,
        next: i32,
    ) -> Result<Assignment, String> {
        if world <= 0 || rank < 0 || rank >= world {
            return Err(format!("rank {rank} in a world of {world}"));
        }
        let other = |what: &str, q: i32| -> Result<Option<u32>, String> {
            match q {
                -1 => Ok(None),
                q if q >= 0 && q < world && q != rank => Ok(Some(q as u32)),
                q => Err(format!("{what} {q} for rank {rank} of {world}")),
            }
        };
        let parent = other("parent", parent)?;
        let tree = tree
            .into_iter()
            .map(|q| other("tree neighbour", q)?.ok_or_else(|| "tree neighbour -1".to_string()))
            .collect::<Result<BTreeSet<u32>, String>>()?;
        if let Some(p) = parent.filter(|p| !tree.contains(p)) {
            return Err(format!(
                "parent {p} is not among the tree neighbours {tree:?}"
            ));
        }
        let (prev, next) = (other("ring prev", prev)?, other("ring next", next)?);
        let mut link_set = tree.clone();
        link_set.extend(prev.iter().chain(next.iter()));
        Ok(Assignment {
            rank: rank as u32,
            world: world as u32,
            parent,
            tree: tree.into_iter().collect(),
            prev,
            next,
            link_set,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_are_checked() {
        let ok = Assignment::check(1, 0, 4, vec![0, 2], 0, 2);
        assert!(matches!(ok, Ok(ref a) if a.link_set.iter().copied().eq([0, 2])));
        assert!(Assignment::check(4, 0, 4, vec![0], 3, 0).is_err());
        assert!(Assignment::check(1, 3, 4, vec![0, 2], 0, 2).is_err());
        assert!(Assignment::check(1, 0, 4, vec![0, 1], 0, 2).is_err());
        assert!(Assignment::check(0, -1, 1, vec![], -1, -1).is_ok());
        assert!(Assignment::check(0, -1, 0, vec![], -1, -1).is_err());
    }
}
