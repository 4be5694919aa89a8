//! Slurm's compact lists, as Slurm writes them into a job's environment:
//! `SLURM_JOB_NODELIST`/`SLURM_STEP_NODELIST` (`node[01-03,07],gpu5`) and
//! `SLURM_TASKS_PER_NODE` (`2(x3),1`). Read by the bootstrap (rank 0's host is the
//! first of the step's nodes) and by `switchyard launch --launcher slurm` (the hosts
//! of the allocation it runs in).

/// Most hosts one list may expand to; more is surely a malformed range.
const MAX_HOSTS: usize = 1 << 20;

/// Every host of a Slurm node list, in order: `node[01-03,07],gpu5` is `node01`,
/// `node02`, `node03`, `node07`, `gpu5`. Ranges keep their zero padding, and a name
/// with several bracket groups (`rack[1-2]-n[5,9]`) takes every combination, the last
/// group turning fastest. `None` for a list that is empty or malformed (an unclosed
/// bracket, a range that runs backwards, a non-number in brackets).
///
/// # Examples
///
/// ```
/// use switchyard_bootstrap::slurm::expand_node_list;
/// assert_eq!(
///     expand_node_list("node[01-03,07],gpu5").unwrap(),
///     ["node01", "node02", "node03", "node07", "gpu5"]
/// );
/// assert_eq!(expand_node_list("n[3-1]"), None);
/// ```
pub fn expand_node_list(list: &str) -> Option<Vec<String>> {
    let mut hosts = Vec::new();
    for item in split_top_level(list.trim())? {
        let item = item.trim();
        if item.is_empty() {
            return None;
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while let Some(open) = rest.find('[') {
            let close = open + rest[open..].find(']')?;
            let prefix = &rest[..open];
            let choices = expand_brackets(&rest[open + 1..close])?;
            let mut next = Vec::with_capacity(names.len() * choices.len());
            for name in &names {
                for choice in &choices {
                    next.push(format!("{name}{prefix}{choice}"));
                }
            }
            if next.len() > MAX_HOSTS {
                return None;
            }
            names = next;
            rest = &rest[close + 1..];
        }
        if rest.contains(']') {
            return None;
        }
        for name in &mut names {
            name.push_str(rest);
        }
        hosts.extend(names);
        if hosts.len() > MAX_HOSTS {
            return None;
        }
    }
    (!hosts.is_empty()).then_some(hosts)
}

/// The list's items: split at the commas outside brackets; `None` for unbalanced ones.
fn split_top_level(list: &str) -> Option<Vec<&str>> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return None;
    }
    items.push(&list[start..]);
    Some(items)
}

/// `01-03,07` as `01`, `02`, `03`, `07`.
fn expand_brackets(inner: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for part in inner.split(',') {
        let part = part.trim();
        let (low, high) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(low) || !digits(high) {
            return None;
        }
        let (from, to): (u64, u64) = (low.parse().ok()?, high.parse().ok()?);
        if to < from || to - from >= MAX_HOSTS as u64 {
            return None;
        }
        let width = low.len();
        out.extend((from..=to).map(|n| format!("{n:0width$}")));
    }
    Some(out)
}

/// `SLURM_TASKS_PER_NODE` (`2(x3),1`) as one count per node (`2, 2, 2, 1`); `None`
/// when malformed.
///
/// # Examples
///
/// ```
/// use switchyard_bootstrap::slurm::tasks_per_node;
/// assert_eq!(tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
/// ```
pub fn tasks_per_node(text: &str) -> Option<Vec<u32>> {
    let mut counts = Vec::new();
    for part in text.trim().split(',') {
        let part = part.trim();
        let (count, repeat) = match part.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count: u32 = count.parse().ok()?;
        if repeat == 0 || counts.len() + repeat > MAX_HOSTS {
            return None;
        }
        counts.extend(std::iter::repeat_n(count, repeat));
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn hosts(list: &str) -> Option<Vec<String>> {
        expand_node_list(list)
    }

    #[test]
    fn node_lists_expand_in_order_keeping_padding() {
        assert_eq!(
            hosts("node[01-03,07]").unwrap(),
            ["node01", "node02", "node03", "node07"]
        );
        assert_eq!(hosts("gpu5,gpu6").unwrap(), ["gpu5", "gpu6"]);
        assert_eq!(hosts("n[7]").unwrap(), ["n7"]);
        assert_eq!(
            hosts("rack[2-3]-n[5,9]").unwrap(),
            ["rack2-n5", "rack2-n9", "rack3-n5", "rack3-n9"]
        );
        assert_eq!(
            hosts("a[10-11],b[1-2]x").unwrap(),
            ["a10", "a11", "b1x", "b2x"]
        );
        assert_eq!(hosts("n[8-10]").unwrap(), ["n8", "n9", "n10"]);
    }

    #[test]
    fn malformed_node_lists_are_none() {
        for bad in [
            "", ",", "a,", "n[1-", "n]1", "n[3-1]", "n[a-b]", "n[]", "n[1-2", "n[1]]",
        ] {
            assert_eq!(hosts(bad), None, "{bad:?}");
        }
        assert_eq!(hosts("n[0-99999999]"), None, "a range past the limit");
    }

    #[test]
    fn tasks_per_node_repeats() {
        assert_eq!(tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(tasks_per_node("4").unwrap(), [4]);
        for bad in ["", "x", "2(x0)", "2(x3", "2(3)"] {
            assert_eq!(tasks_per_node(bad), None, "{bad:?}");
        }
    }
}
