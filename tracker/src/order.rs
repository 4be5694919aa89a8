//! The order of a batch of `start`s, which becomes their rank order.
//!
//! The reference trackers compare task ids as strings, so task `"10"` gets a lower rank
//! than task `"2"`. Here task ids that are both decimal integers compare numerically
//! (`"2"` before `"10"`), which is what launchers numbering their processes expect. To
//! keep the order total (a stable sort needs one), ids fall into three classes, in this
//! order: decimal integers (by value, ties by text), other ids (bytewise), and no id
//! (`NULL` or empty), which are all equal and so keep their arrival order.

use crate::common::SortBy;
use std::cmp::Ordering;

/// A task id's place in the order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TaskKey<'a> {
    /// A decimal integer: by value (digit count after leading zeros, then digits),
    /// then by the text itself so that `"07"` and `"7"` still differ.
    Number(usize, &'a str, &'a str),
    /// Any other text, bytewise.
    Text(&'a str),
    /// `NULL` or empty: no id; all equal.
    None,
}

fn task_key(task: Option<&str>) -> TaskKey<'_> {
    match task {
        None => TaskKey::None,
        Some(t) if t.is_empty() || t == "NULL" => TaskKey::None,
        Some(t) if t.bytes().all(|b| b.is_ascii_digit()) => {
            let digits = t.trim_start_matches('0');
            TaskKey::Number(digits.len(), digits, t)
        }
        Some(t) => TaskKey::Text(t),
    }
}

/// Compares two task ids as described in the module docs.
pub(crate) fn compare_tasks(a: Option<&str>, b: Option<&str>) -> Ordering {
    task_key(a).cmp(&task_key(b))
}

/// Compares two batch members, each given as (peer IP text, task id).
pub(crate) fn compare(
    sort_by: SortBy,
    a: (&str, Option<&str>),
    b: (&str, Option<&str>),
) -> Ordering {
    match sort_by {
        SortBy::Host => a.0.cmp(b.0).then_with(|| compare_tasks(a.1, b.1)),
        SortBy::Task => compare_tasks(a.1, b.1),
    }
}

/// Sorts `items` (in arrival order) into rank order; stable, so equal keys keep
/// arrival order.
pub(crate) fn sort_batch<T>(
    items: &mut [T],
    sort_by: SortBy,
    key: impl Fn(&T) -> (&str, Option<&str>),
) {
    items.sort_by(|a, b| compare(sort_by, key(a), key(b)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_by_value_and_come_first() {
        let mut ids = vec!["b", "10", "a", "2", "007", "7", "1a"];
        ids.sort_by(|a, b| compare_tasks(Some(a), Some(b)));
        assert_eq!(ids, ["2", "007", "7", "10", "1a", "a", "b"]);
    }

    #[test]
    fn missing_ids_keep_arrival_order_after_the_others() {
        let mut items = vec![(0, None), (1, Some("NULL")), (2, Some("x")), (3, Some(""))];
        sort_batch(&mut items, SortBy::Task, |(_, t)| ("h", *t));
        let order: Vec<i32> = items.iter().map(|(i, _)| *i).collect();
        assert_eq!(order, [2, 0, 1, 3]);
    }

    #[test]
    fn host_sorts_before_task_unless_sorting_by_task() {
        let mut items = vec![("10.0.0.2", Some("0")), ("10.0.0.1", Some("1"))];
        sort_batch(&mut items, SortBy::Host, |(h, t)| (h, *t));
        assert_eq!(items[0].0, "10.0.0.1");
        sort_batch(&mut items, SortBy::Task, |(h, t)| (h, *t));
        assert_eq!(items[0].0, "10.0.0.2");
    }
}
