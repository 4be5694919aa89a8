//! The shell blocks of the documents: every ```` ```sh ```` or ```` ```bash ```` block of
//! `README.md` and of the pages under `docs/` (except the dated benchmark log,
//! `docs/benchmarks/`) carries a marker as the last line before it that is not blank, an
//! HTML comment that says whether CI runs it (docs/testing.md, "The documents' shell
//! blocks"):
//!
//! - `<!-- runs in CI -->`: this test runs the block with `bash -euo pipefail` at the
//!   repository root, the built `switchyard` first on the `PATH`, and requires exit
//!   status 0;
//!   `<!-- runs in CI; expects "TEXT" "TEXT" -->` also requires each text in the
//!   block's output (stdout and stderr together);
//! - `<!-- not run in CI: REASON -->`: the block is not run, for the reason given.
//!
//! A block without a marker, a marker with no shell block after it and a marker this
//! test cannot read all fail the test, so that a new block is never silently unchecked.
//!
//! The documents build in release mode; a debug build of this test runs each block
//! against the debug build instead, by one substitution applied to every block alike:
//! `target/release/` becomes the test's own profile folder (`target/debug/`) and every
//! `--release` argument is dropped. A release build of this test runs the blocks as
//! written.
//!
//! This is a test binary of its own, not a module of `tests/it/`: the blocks run
//! `cargo build`, which re-links `target/debug/switchyard` and the examples, and the
//! tests of `tests/it/` run those files side by side; cargo runs one test binary at a
//! time, so nothing else of the package runs while these blocks build. When they are
//! done, the test puts back the files they re-linked ([`BuiltFiles`]), so that the test
//! binaries after this one run the programs their own build made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long one block may run: a cold build of the examples and the command (the first
/// block that builds pays for the others) plus the job.
const BLOCK_LIMIT: Duration = Duration::from_secs(900);

/// The info strings that open a shell block.
const SHELL_LANGUAGES: &[&str] = &["sh", "bash", "shell", "console", "zsh"];

/// What a block's marker asks for.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    /// Run the block; its output must contain each text.
    Run { expects: Vec<String> },
    /// Do not run it, for this reason.
    Skip { reason: String },
}

/// A shell block of a document.
#[derive(Debug)]
struct Block {
    /// The document, relative to the repository root.
    file: String,
    /// The line of the opening fence, from 1.
    line: usize,
    /// The lines between the fences.
    text: String,
    /// Its marker, or why there is none that this test can read.
    marker: Result<Marker, String>,
}

/// The repository root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// The folder of docs/ whose blocks are not checked: the dated benchmark log, which
/// records the commands behind past measurements (release builds of that day's commit
/// on a quiet machine) rather than telling a reader what to run.
const NOT_CHECKED: &str = "docs/benchmarks";

/// README.md and every Markdown file under docs/ but [`NOT_CHECKED`], relative to the
/// root, sorted.
fn documents(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read docs/") {
            let path = entry.expect("a docs/ entry").path();
            if path.is_dir() {
                if path != root.join(NOT_CHECKED) {
                    walk(&path, root, out);
                }
            } else if path.extension().is_some_and(|e| e == "md") {
                let relative = path.strip_prefix(root).expect("under the root");
                out.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = vec!["README.md".to_string()];
    walk(&root.join("docs"), root, &mut out);
    out.sort();
    out
}

/// Reads a marker comment's text (between `<!--` and `-->`); `None` when the comment
/// is not a marker at all.
fn parse_marker(body: &str) -> Option<Result<Marker, String>> {
    let body = body.trim();
    if let Some(rest) = body.strip_prefix("not run in CI") {
        let reason = rest.trim_start().strip_prefix(':').map(str::trim);
        return Some(match reason {
            Some(reason) if !reason.is_empty() => Ok(Marker::Skip {
                reason: reason.to_string(),
            }),
            _ => Err(format!(
                "`<!-- {body} -->` gives no reason: write `<!-- not run in CI: REASON -->`"
            )),
        });
    }
    let rest = body.strip_prefix("runs in CI")?.trim();
    if rest.is_empty() {
        return Some(Ok(Marker::Run {
            expects: Vec::new(),
        }));
    }
    let malformed = || {
        Err(format!(
            "`<!-- {body} -->`: expected `<!-- runs in CI -->` or \
             `<!-- runs in CI; expects \"TEXT\" \"TEXT\" -->`"
        ))
    };
    let Some(list) = rest
        .strip_prefix(';')
        .and_then(|r| r.trim().strip_prefix("expects"))
    else {
        return Some(malformed());
    };
    let mut expects = Vec::new();
    let mut list = list.trim();
    while !list.is_empty() {
        let Some(quoted) = list.strip_prefix('"') else {
            return Some(malformed());
        };
        let Some(end) = quoted.find('"') else {
            return Some(malformed());
        };
        if end == 0 {
            return Some(malformed());
        }
        expects.push(quoted[..end].to_string());
        list = quoted[end + 1..].trim_start();
    }
    if expects.is_empty() {
        return Some(malformed());
    }
    Some(Ok(Marker::Run { expects }))
}

/// The shell blocks of one document, and the problems with its markers that belong to
/// no block (a marker with no shell block after it).
fn shell_blocks(file: &str, text: &str) -> (Vec<Block>, Vec<String>) {
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    // The last marker seen, waiting for its block: its line and what it says.
    let mut pending: Option<(usize, Result<Marker, String>)> = None;
    let mut lines = text.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        let number = index + 1;
        let stripped = line.trim_start();
        if stripped.is_empty() {
            continue;
        }
        let fence_char = match stripped.chars().next() {
            Some(c @ ('`' | '~')) if stripped.starts_with(&c.to_string().repeat(3)) => Some(c),
            _ => None,
        };
        if let Some(fence_char) = fence_char {
            let indent = line.len() - stripped.len();
            let fence_len = stripped.chars().take_while(|&c| c == fence_char).count();
            let info = stripped[fence_len..].trim();
            let language = info
                .split(|c: char| c == ',' || c == '{' || c.is_whitespace())
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
            let mut body = Vec::new();
            for (_, inner) in lines.by_ref() {
                let inner_stripped = inner.trim_start();
                let closing_len = inner_stripped
                    .chars()
                    .take_while(|&c| c == fence_char)
                    .count();
                if closing_len >= fence_len && inner_stripped[closing_len..].trim().is_empty() {
                    break;
                }
                // The block's own indentation (a block inside a list item) is not part
                // of its text.
                let cut = inner.len() - inner.trim_start_matches(' ').len();
                body.push(&inner[cut.min(indent)..]);
            }
            let marker = pending.take();
            if SHELL_LANGUAGES.contains(&language.as_str()) {
                let marker = match marker {
                    Some((_, marker)) => marker,
                    None => Err(
                        "no marker: put `<!-- runs in CI -->` or `<!-- not run in CI: REASON -->` \
                         on the line before the block"
                            .to_string(),
                    ),
                };
                let mut text = body.join("\n");
                text.push('\n');
                blocks.push(Block {
                    file: file.to_string(),
                    line: number,
                    text,
                    marker,
                });
            } else if let Some((marker_line, _)) = marker {
                problems.push(format!(
                    "{file}:{marker_line}: a shell-block marker before a `{language}` block"
                ));
            }
            continue;
        }
        if let Some((marker_line, _)) = pending.take() {
            problems.push(format!(
                "{file}:{marker_line}: a shell-block marker with no shell block after it"
            ));
        }
        if let Some(comment) = stripped
            .strip_prefix("<!--")
            .and_then(|c| c.trim_end().strip_suffix("-->"))
        {
            pending = parse_marker(comment).map(|marker| (number, marker));
        }
    }
    if let Some((marker_line, _)) = pending {
        problems.push(format!(
            "{file}:{marker_line}: a shell-block marker with no shell block after it"
        ));
    }
    (blocks, problems)
}

/// Every shell block of the documents, and the problems with markers that belong to no
/// block.
fn all_blocks() -> (Vec<Block>, Vec<String>) {
    let root = root();
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    for file in documents(&root) {
        let text = std::fs::read_to_string(root.join(&file)).expect("read a document");
        let (b, p) = shell_blocks(&file, &text);
        blocks.extend(b);
        problems.extend(p);
    }
    (blocks, problems)
}

/// The block as this build runs it: for a debug build, `target/release/` becomes
/// `profile_dir` and each `--release` argument goes; for a release build (`profile_dir`
/// `None`), the block as written.
fn for_this_build(text: &str, profile_dir: Option<&str>) -> String {
    let Some(profile_dir) = profile_dir else {
        return text.to_string();
    };
    let replaced = text.replace("target/release/", &format!("{profile_dir}/"));
    let mut out = String::with_capacity(replaced.len());
    for line in replaced.split_inclusive('\n') {
        let mut rest = line;
        while let Some(at) = rest.find("--release") {
            let after = &rest[at + "--release".len()..];
            let before_ok = rest[..at].ends_with([' ', '\t']);
            let after_ok = after.is_empty() || after.starts_with([' ', '\t', '\n', '\\']);
            if before_ok && after_ok {
                // Drop the argument and the blank before it.
                out.push_str(rest[..at].strip_suffix([' ', '\t']).unwrap_or(&rest[..at]));
                rest = after;
            } else {
                out.push_str(&rest[..at + "--release".len()]);
                rest = after;
            }
        }
        out.push_str(rest);
    }
    out
}

/// Kills the process group of a block's shell when the test leaves it early.
struct GroupGuard(Option<Child>);

impl GroupGuard {
    /// SIGKILL to every process of the group (the shell's pid is the group's id).
    fn kill_group(child: &Child) {
        let pgid = child.id() as libc::pid_t;
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is
        // involved.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            Self::kill_group(&child);
            let _ = child.wait();
        }
    }
}

/// The built programs as the test's own build left them, put back when the blocks are
/// done.
///
/// A block's `cargo build` links its programs into the profile folder
/// (`target/debug/switchyard`, `target/debug/examples/*`) with the features of its own
/// package selection, replacing the files that the test binaries run after this one
/// execute as `CARGO_BIN_EXE_switchyard` and as examples (built with `--features mpi`,
/// for one). A hard link to every file of those two folders keeps the files the build
/// left; each one a block replaced gets its old file back, on failure too.
struct BuiltFiles {
    /// The folder of the hard links.
    saved: PathBuf,
    /// Each file, its hard link and the inode it had.
    files: Vec<(PathBuf, PathBuf, u64)>,
}

impl BuiltFiles {
    /// Links every file of `profile_dir` and of its `examples/` into a folder of its own.
    fn save(profile_dir: &Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        let saved = profile_dir.join(format!("doc-shell-saved-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&saved);
        std::fs::create_dir_all(&saved).expect("create the folder of saved files");
        let mut files = Vec::new();
        for dir in [profile_dir.to_path_buf(), profile_dir.join("examples")] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                if !meta.is_file() {
                    continue;
                }
                let link = saved.join(files.len().to_string());
                if std::fs::hard_link(&path, &link).is_ok() {
                    files.push((path, link, meta.ino()));
                }
            }
        }
        BuiltFiles { saved, files }
    }
}

impl Drop for BuiltFiles {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        for (path, link, ino) in &self.files {
            let same = std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == *ino);
            if !same {
                let _ = std::fs::rename(link, path);
            }
        }
        let _ = std::fs::remove_dir_all(&self.saved);
    }
}

/// What a block's run came to.
struct Outcome {
    /// The exit status, or `None` when it ran past the limit and was killed.
    success: Option<bool>,
    /// Its stdout and stderr, interleaved as written.
    output: String,
    /// How long it ran.
    took: Duration,
}

/// Runs `script` with `bash -euo pipefail` at `root` with `path` as its `PATH` (and
/// `target_dir`, if any, as its `CARGO_TARGET_DIR`), its output to the file `log` (read,
/// then removed), within [`BLOCK_LIMIT`]; every process it leaves behind is killed.
fn run_block(
    script: &str,
    root: &Path,
    path: &std::ffi::OsStr,
    target_dir: Option<&Path>,
    log: &Path,
) -> Outcome {
    let file = File::create(log).expect("create the block's log");
    let mut command = Command::new("bash");
    command
        .args(["--noprofile", "--norc", "-euo", "pipefail", "-c", script])
        .current_dir(root)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("clone the log"))
        .stderr(file)
        .process_group(0);
    if let Some(target_dir) = target_dir {
        command.env("CARGO_TARGET_DIR", target_dir);
    }
    // The blocks run as in a fresh shell of one host: no job of an enclosing launcher.
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        let launcher = ["DMLC_", "SWITCHYARD_", "SLURM_", "OMPI_", "PMI_", "PMIX_"]
            .iter()
            .any(|p| name_text.starts_with(p))
            || [
                "MASTER_ADDR",
                "MASTER_PORT",
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
            ]
            .contains(&name_text.as_ref());
        if launcher {
            command.env_remove(&name);
        }
    }
    let started = Instant::now();
    let mut guard = GroupGuard(Some(command.spawn().expect("spawn bash")));
    let success = loop {
        let child = guard.0.as_mut().expect("the shell");
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status.success());
        }
        if started.elapsed() > BLOCK_LIMIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    // Whatever the block left running (a process put in the background) goes with it.
    if let Some(child) = guard.0.take() {
        GroupGuard::kill_group(&child);
        let mut child = child;
        let _ = child.wait();
    }
    let output = String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).into_owned();
    let _ = std::fs::remove_file(log);
    Outcome {
        success,
        output,
        took,
    }
}

/// Every shell block of the documents carries a marker this test can read, and every
/// marker belongs to a shell block.
#[test]
fn every_shell_block_says_whether_ci_runs_it() {
    let (blocks, mut problems) = all_blocks();
    assert!(!blocks.is_empty(), "no shell block found in the documents");
    for block in &blocks {
        match &block.marker {
            Err(why) => problems.push(format!("{}:{}: {why}", block.file, block.line)),
            Ok(Marker::Run { .. }) if block.text.trim().is_empty() => {
                problems.push(format!("{}:{}: an empty block", block.file, block.line));
            }
            Ok(_) => {}
        }
    }
    assert!(
        problems.is_empty(),
        "the documents' shell blocks (docs/testing.md, \"The documents' shell blocks\"):\n{}",
        problems.join("\n")
    );
}

/// Every block marked `runs in CI` exits 0 and prints what its marker expects.
#[test]
fn the_shell_blocks_marked_to_run_succeed() {
    let root = root();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_switchyard"))
        .parent()
        .expect("the binary's folder")
        .to_path_buf();
    // Which substitution applies: none for a release build of this test, the debug
    // folder (relative to the root when it is the default one) for a debug build.
    let profile_dir = match bin_dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => None,
        Some("debug") => Some(match bin_dir.strip_prefix(&root) {
            Ok(relative) => relative.to_string_lossy().into_owned(),
            Err(_) => bin_dir.to_string_lossy().into_owned(),
        }),
        other => panic!("a build profile this test does not know: {other:?}"),
    };
    // The built command first, then the cargo that runs this test (the same toolchain
    // for the blocks' cargo commands), then the caller's PATH.
    let mut path_dirs = vec![bin_dir.clone()];
    if let Some(cargo) = std::env::var_os("CARGO") {
        if let Some(dir) = Path::new(&cargo).parent() {
            path_dirs.push(dir.to_path_buf());
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        path_dirs.extend(std::env::split_paths(&path));
    }
    let path = std::env::join_paths(path_dirs).expect("a PATH");

    // The blocks' cargo builds where this test's build went (a --target-dir of the
    // caller's, too), so that the paths the substitution gives name what they built.
    let target_dir = bin_dir.parent().expect("the target folder").to_path_buf();

    let (blocks, _) = all_blocks();
    let _built = BuiltFiles::save(&bin_dir);
    let mut failures = Vec::new();
    let mut ran = 0;
    let started = Instant::now();
    for (index, block) in blocks.iter().enumerate() {
        let Ok(Marker::Run { expects }) = &block.marker else {
            continue;
        };
        ran += 1;
        let script = for_this_build(&block.text, profile_dir.as_deref());
        let log = std::env::temp_dir().join(format!(
            "switchyard-doc-shell-{}-{index}.log",
            std::process::id()
        ));
        let outcome = run_block(&script, &root, &path, Some(&target_dir), &log);
        let place = format!("{}:{}", block.file, block.line);
        eprintln!("{place}: {:.1} s", outcome.took.as_secs_f64());
        let mut wrong = Vec::new();
        match outcome.success {
            None => wrong.push(format!("still running after {BLOCK_LIMIT:?}, killed")),
            Some(false) => wrong.push("exited non-zero".to_string()),
            Some(true) => {}
        }
        for text in expects {
            if !outcome.output.contains(text.as_str()) {
                wrong.push(format!("printed no {text:?}"));
            }
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "{place}: {}\n--- the block as run:\n{script}--- its output:\n{}",
                wrong.join("; "),
                outcome.output
            ));
        }
    }
    eprintln!(
        "{ran} shell blocks ran in {:.1} s; {} are marked not to run",
        started.elapsed().as_secs_f64(),
        blocks
            .iter()
            .filter(|b| matches!(b.marker, Ok(Marker::Skip { .. })))
            .count()
    );
    assert!(ran > 0, "no shell block is marked `runs in CI`");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The markers as the documents write them, and what is not a marker.
#[test]
fn markers_parse() {
    assert_eq!(
        parse_marker(" runs in CI "),
        Some(Ok(Marker::Run { expects: vec![] }))
    );
    assert_eq!(
        parse_marker("runs in CI; expects \"rank 3 of 4\" \"done\""),
        Some(Ok(Marker::Run {
            expects: vec!["rank 3 of 4".into(), "done".into()]
        }))
    );
    assert_eq!(
        parse_marker("not run in CI: needs sudo"),
        Some(Ok(Marker::Skip {
            reason: "needs sudo".into()
        }))
    );
    assert!(matches!(parse_marker("not run in CI"), Some(Err(_))));
    assert!(matches!(parse_marker("not run in CI:  "), Some(Err(_))));
    assert!(matches!(
        parse_marker("runs in CI; prints \"x\""),
        Some(Err(_))
    ));
    assert!(matches!(
        parse_marker("runs in CI; expects x"),
        Some(Err(_))
    ));
    assert!(matches!(
        parse_marker("runs in CI; expects \"\""),
        Some(Err(_))
    ));
    assert_eq!(parse_marker("a note to editors"), None);
}

/// Blocks, their markers and the problems of a made-up document.
#[test]
fn blocks_and_markers_are_found() {
    let doc = "\
# Title

<!-- runs in CI -->
```sh
echo one
```

<!-- not run in CI: needs sudo -->

```bash
sudo true
```

```sh
echo unmarked
```

- a list item:

  <!-- runs in CI; expects \"two\" -->
  ```sh
  echo two
  ```

<!-- runs in CI -->
```rust
fn main() {}
```

<!-- runs in CI -->
Some prose.

````text
<!-- runs in CI -->
```sh
not a block: inside another
```
````
";
    let (blocks, problems) = shell_blocks("doc.md", doc);
    let summary: Vec<_> = blocks
        .iter()
        .map(|b| (b.line, b.text.as_str(), b.marker.clone()))
        .collect();
    assert_eq!(summary.len(), 4, "{summary:#?}");
    assert_eq!(
        summary[0],
        (4, "echo one\n", Ok(Marker::Run { expects: vec![] }))
    );
    assert_eq!(
        summary[1],
        (
            10,
            "sudo true\n",
            Ok(Marker::Skip {
                reason: "needs sudo".into()
            })
        )
    );
    assert_eq!(summary[2].0, 14);
    assert!(summary[2].2.is_err());
    assert_eq!(
        summary[3],
        (
            21,
            "echo two\n",
            Ok(Marker::Run {
                expects: vec!["two".into()]
            })
        )
    );
    assert_eq!(
        problems,
        vec![
            "doc.md:25: a shell-block marker before a `rust` block".to_string(),
            "doc.md:30: a shell-block marker with no shell block after it".to_string(),
        ]
    );
}

/// The substitution that runs a release block against a debug build.
#[test]
fn release_paths_become_the_debug_build() {
    let block = "cargo build --release -p switchyard-cli            # note\n\
                 cargo run --release --example allreduce -- 7\n\
                 target/release/switchyard launch -n 4 -- target/release/examples/kmeans\n\
                 echo --release-notes x--release\n\
                 cargo build --release\n";
    assert_eq!(
        for_this_build(block, Some("target/debug")),
        "cargo build -p switchyard-cli            # note\n\
         cargo run --example allreduce -- 7\n\
         target/debug/switchyard launch -n 4 -- target/debug/examples/kmeans\n\
         echo --release-notes x--release\n\
         cargo build\n"
    );
    assert_eq!(for_this_build(block, None), block);
}

/// A block's exit status and output come back, and what it left running in the
/// background is killed with it.
#[test]
fn a_block_that_fails_is_seen_and_its_leftovers_are_killed() {
    let log = std::env::temp_dir().join(format!(
        "switchyard-doc-shell-{}-self-test.log",
        std::process::id()
    ));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let outcome = run_block(
        "sleep 300 &\necho \"left $!\"\nfalse\necho not reached\n",
        &root(),
        &path,
        None,
        &log,
    );
    assert_eq!(outcome.success, Some(false), "{}", outcome.output);
    assert!(
        !outcome.output.contains("not reached"),
        "{}",
        outcome.output
    );
    let pid: u32 = outcome
        .output
        .lines()
        .find_map(|l| l.strip_prefix("left "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {:?}", outcome.output));
    // Gone, or a zombie waiting for its new parent to reap it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.trim().chars().next());
        if stat.is_empty() || state == Some('Z') {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the background sleep {pid} still runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
