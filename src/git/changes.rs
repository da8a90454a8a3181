//! What differs between a worktree (or its branch) and its base: the files
//! with their line counts, the branch's commits, and a unified diff.

use std::path::Path;

use tokio::io::AsyncReadExt;

use super::{lossy, parse_log, records, unreachable, Diff, Git, GitError, Source, TempIndex};
use crate::model::{ChangeTotals, ChangedFile, Changes, FileStatus, Worktree};

/// At most this many files are listed.
const MAX_FILES: usize = 1000;
/// At most this many commits are listed.
const MAX_COMMITS: usize = 200;

/// What [`Git::changes`] does.
pub(super) async fn changes(
    git: &Git,
    worktree: &Worktree,
    source: Source,
) -> Result<Changes, GitError> {
    if let Some(e) = unreachable(worktree, source) {
        return Err(e);
    }
    let base_ref = format!("refs/heads/{}", worktree.base);
    let branch_ref = format!("refs/heads/{}", worktree.branch);
    let range = format!("{base_ref}..{branch_ref}");
    let log = git
        .at(&worktree.repository)
        .args(["log", "-z", "--format=%H%x1f%an%x1f%aI%x1f%s"])
        .arg(format!("-n{MAX_COMMITS}"))
        .arg(&range)
        .arg("--")
        .ok();
    let merge_base = git
        .at(&worktree.repository)
        .args(["merge-base", &base_ref, &branch_ref])
        .text();
    let (mut files, uncommitted, log, merge_base) = match source {
        Source::Worktree => {
            // Most often nothing is untracked: then the worktree's own diff
            // (its index only read) says it all in one pass over the files.
            // The untracked files are looked for meanwhile; where there are
            // some, a copy of the index takes everything and is diffed.
            let tracked = git
                .at(&worktree.path)
                .args(["diff", "--merge-base", &base_ref])
                .args(["-z", "--raw", "--numstat", "-M", "--no-ext-diff", "--"])
                .ok();
            let untracked = git
                .at(&worktree.path)
                .args(["ls-files", "-z", "--others", "--exclude-standard"])
                .ok();
            // Without commits of its own the branch is at the merge base:
            // what differs from it is all uncommitted. With some, what
            // differs from HEAD is read as soon as that is known.
            let log_and_uncommitted = async {
                let log = log.await?;
                if records(&log).next().is_none() {
                    return Ok((log, None));
                }
                let out = git
                    .at(&worktree.path)
                    .args(["diff", "--name-only", "-z", "-M", "HEAD", "--"])
                    .ok()
                    .await?;
                Ok::<_, GitError>((log, Some(records(&out).count() as u64)))
            };
            let (tracked, untracked, log_and_uncommitted, merge_base) =
                tokio::join!(tracked, untracked, log_and_uncommitted, merge_base);
            let ((log, uncommitted), merge_base) = (log_and_uncommitted?, merge_base?);
            let own_commits = uncommitted.is_some();
            let untracked = untracked?;
            let (files, uncommitted) = if records(&untracked).next().is_none() {
                let files = parse_raw_numstat(&tracked?);
                let uncommitted = uncommitted.unwrap_or(files.len() as u64);
                (files, uncommitted)
            } else if let Some(files) = tracked
                .as_ref()
                .ok()
                .and_then(|tracked| with_untracked_read(worktree, tracked, &untracked))
            {
                // The tracked files' diff, and the new files read: what
                // differs from HEAD is what did among the tracked files, and
                // every new file.
                let new = records(&untracked).count() as u64;
                let uncommitted = uncommitted.unwrap_or(files.len() as u64 - new) + new;
                (files, uncommitted)
            } else {
                let only = match tracked {
                    Ok(tracked) => {
                        differing_paths(git, worktree, &base_ref, &tracked, &untracked).await?
                    }
                    Err(_) => None,
                };
                let (diff, uncommitted) =
                    everything_added(git, worktree, &base_ref, only, own_commits).await?;
                (parse_raw_numstat(&diff), uncommitted)
            };
            (files, uncommitted, log, merge_base)
        }
        Source::Branch => {
            let diff = git
                .at(&worktree.repository)
                .args(["diff", "--merge-base", &base_ref, &branch_ref])
                .args(["-z", "--raw", "--numstat", "-M", "--no-ext-diff", "--"])
                .ok();
            let (diff, log, merge_base) = tokio::join!(diff, log, merge_base);
            (parse_raw_numstat(&diff?), 0, log?, merge_base?)
        }
    };
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let commits = parse_log(&log)?;
    let commit_count = if commits.len() < MAX_COMMITS {
        commits.len() as u64
    } else {
        git.at(&worktree.repository)
            .args(["rev-list", "--count", &range, "--"])
            .text()
            .await?
            .parse()
            .unwrap_or(commits.len() as u64)
    };
    let totals = ChangeTotals {
        files: files.len() as u64,
        added: files.iter().map(|f| f.added).sum(),
        removed: files.iter().map(|f| f.removed).sum(),
        commits: commit_count,
    };
    let truncated = files.len() > MAX_FILES;
    files.truncate(MAX_FILES);
    // The branch's tip: its newest commit the base lacks, or (none) the
    // merge base itself.
    let head = commits
        .first()
        .map_or_else(|| merge_base.clone(), |c| c.id.clone());
    Ok(Changes {
        base: worktree.base.clone(),
        branch: worktree.branch.clone(),
        merge_base,
        head,
        totals,
        files,
        truncated,
        commits,
        uncommitted,
    })
}

/// The bytes git looks at to tell a binary file (a NUL among them).
const BINARY_SNIFF: usize = 8000;

/// The worktree's tracked files' diff (`tracked`) with its untracked files
/// (`untracked`, from `ls-files --others`) added as git would show them new:
/// each read for its lines (a NUL in its first 8000 bytes: binary; a
/// symlink: one line, its target). `None` where only git can say (too many
/// paths, a tracked file deleted (a new one may be it, renamed), a path
/// that is not UTF-8 or is a folder of its own (a nested repository), one
/// the tracked diff names too, one that cannot be read): then the index's
/// copy takes everything.
fn with_untracked_read(
    worktree: &Worktree,
    tracked: &[u8],
    untracked: &[u8],
) -> Option<Vec<ChangedFile>> {
    let mut files = parse_raw_numstat(tracked);
    let paths: Vec<&[u8]> = records(untracked).collect();
    // A file gone beside a new one may be a rename, which git tells.
    if paths.len() > MAX_PATHSPECS || files.iter().any(|f| f.status == FileStatus::Deleted) {
        return None;
    }
    let root = Path::new(&worktree.path);
    for path in paths {
        let path = std::str::from_utf8(path).ok()?;
        if path.ends_with('/')
            || files
                .iter()
                .any(|f| f.path == path || f.old_path.as_deref() == Some(path))
        {
            return None;
        }
        let full = root.join(path);
        let meta = std::fs::symlink_metadata(&full).ok()?;
        let (lines, binary) = if meta.file_type().is_symlink() {
            (1, false)
        } else if meta.is_file() {
            let content = std::fs::read(&full).ok()?;
            let binary = content[..content.len().min(BINARY_SNIFF)].contains(&0);
            let newlines = content.iter().filter(|b| **b == b'\n').count() as u64;
            let unended = u64::from(content.last().is_some_and(|b| *b != b'\n'));
            (newlines + unended, binary)
        } else {
            return None;
        };
        files.push(ChangedFile {
            path: path.to_owned(),
            old_path: None,
            status: FileStatus::Added,
            added: if binary { 0 } else { lines },
            removed: 0,
            binary,
        });
    }
    Some(files)
}

/// The diff of the worktree with untracked files: a copy of its index
/// takes everything (`add -A`) and is compared with the merge base; and
/// how many files differ from HEAD (from the diff itself when the branch
/// is at the merge base).
async fn everything_added(
    git: &Git,
    worktree: &Worktree,
    base_ref: &str,
    only: Option<Vec<u8>>,
    own_commits: bool,
) -> Result<(Vec<u8>, u64), GitError> {
    let index = TempIndex::copy(git, worktree)?;
    let add = git
        .at(&worktree.path)
        .index(&index.path)
        .config("index.skipHash=true");
    let add = match only {
        // As `add -A` on those paths: each added as it is, or removed if
        // gone (and passed over if neither in the index nor there).
        Some(paths) => add
            .args(["update-index", "--add", "--remove", "-z", "--stdin"])
            .input(paths),
        None => add.args(["add", "-A"]),
    };
    add.ok().await?;
    let diff = git
        .at(&worktree.path)
        .index(&index.path)
        .args(["diff", "--cached", "--merge-base", base_ref])
        .args(["-z", "--raw", "--numstat", "-M", "--no-ext-diff", "--"])
        .ok();
    let uncommitted = async {
        if !own_commits {
            return Ok(None);
        }
        git.at(&worktree.path)
            .index(&index.path)
            .args(["diff", "--cached", "--name-only", "-z", "-M", "HEAD", "--"])
            .ok()
            .await
            .map(|out| Some(records(&out).count() as u64))
    };
    let (diff, uncommitted) = tokio::join!(diff, uncommitted);
    let diff = diff?;
    let uncommitted = match uncommitted? {
        Some(n) => n,
        None => parse_raw_numstat(&diff).len() as u64,
    };
    Ok((diff, uncommitted))
}

/// At most this many paths are updated by name (more: `add -A`).
const MAX_PATHSPECS: usize = 2000;

/// The only paths `add -A` can change in a worktree's index as far as a
/// diff with the merge base goes (NUL-terminated, for
/// `update-index --stdin`): those whose file differs from the merge base
/// (`tracked`, the worktree's diff), those whose index entry does, and the
/// untracked ones. Any other path is the same in the merge base, the index
/// and the worktree. `None`: too many, add everything.
async fn differing_paths(
    git: &Git,
    worktree: &Worktree,
    base_ref: &str,
    tracked: &[u8],
    untracked: &[u8],
) -> Result<Option<Vec<u8>>, GitError> {
    let staged = git
        .at(&worktree.path)
        .args(["diff", "--cached", "--merge-base", base_ref])
        .args(["--name-only", "-z", "--no-renames", "--"])
        .ok()
        .await?;
    let mut paths: Vec<Vec<u8>> = Vec::new();
    for file in parse_raw_numstat(tracked) {
        paths.push(file.path.into_bytes());
        paths.extend(file.old_path.map(String::into_bytes));
    }
    paths.extend(records(&staged).map(<[u8]>::to_vec));
    paths.extend(records(untracked).map(<[u8]>::to_vec));
    if paths.len() > MAX_PATHSPECS || paths.iter().any(|p| lossy(p).contains('\u{fffd}')) {
        return Ok(None);
    }
    let mut out = Vec::new();
    for path in paths {
        out.extend_from_slice(&path);
        out.push(0);
    }
    Ok(Some(out))
}

/// `git diff -z --raw --numstat`: the raw records of all files, then the
/// numstat records of the same files in the same order.
pub(super) fn parse_raw_numstat(out: &[u8]) -> Vec<ChangedFile> {
    let mut fields = records(out).peekable();
    let mut files = Vec::new();
    while let Some(record) = fields.next_if(|r| r.starts_with(b":")) {
        let status = record.split(|b| *b == b' ').nth(4).unwrap_or(b"M");
        let letter = status.first().copied().unwrap_or(b'M');
        let first = lossy(fields.next().unwrap_or_default());
        let (path, old_path) = if matches!(letter, b'R' | b'C') {
            (lossy(fields.next().unwrap_or_default()), Some(first))
        } else {
            (first, None)
        };
        files.push(ChangedFile {
            path,
            old_path,
            status: match letter {
                b'A' => FileStatus::Added,
                b'D' => FileStatus::Deleted,
                b'R' => FileStatus::Renamed,
                b'C' => FileStatus::Copied,
                b'T' => FileStatus::TypeChanged,
                _ => FileStatus::Modified,
            },
            added: 0,
            removed: 0,
            binary: false,
        });
    }
    for file in files.iter_mut() {
        let Some(record) = fields.next() else { break };
        let mut parts = record.splitn(3, |b| *b == b'\t');
        let (added, removed, path) = (parts.next(), parts.next(), parts.next());
        if path == Some(b"") {
            // A rename: its two paths follow.
            fields.next();
            fields.next();
        }
        match (added, removed) {
            (Some(b"-"), Some(b"-")) => file.binary = true,
            (Some(added), Some(removed)) => {
                file.added = std::str::from_utf8(added)
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                file.removed = std::str::from_utf8(removed)
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            _ => {}
        }
    }
    files
}

/// A path the diff may name: relative, inside the worktree.
fn check_path(path: &str) -> Result<(), GitError> {
    let bad = path.is_empty()
        || path.len() > 4096
        || path.contains('\0')
        || path.starts_with('/')
        || path.split('/').any(|part| part == "..");
    if bad {
        return Err(GitError::BadPath(format!(
            "path {:?} leads out of the worktree (a path must be relative, /-separated, \
             without .. and at most 4096 bytes)",
            super::cut(path.to_owned(), 200)
        )));
    }
    Ok(())
}

/// What [`Git::diff`] does.
pub(super) async fn diff(
    git: &Git,
    worktree: &Worktree,
    source: Source,
    path: Option<&str>,
    max_bytes: usize,
) -> Result<Diff, GitError> {
    if let Some(path) = path {
        check_path(path)?;
    }
    if let Some(e) = unreachable(worktree, source) {
        return Err(e);
    }
    let base_ref = format!("refs/heads/{}", worktree.base);
    let options = ["-M", "--no-color", "--no-ext-diff", "--no-textconv"];
    let pathspec = path.map(|p| format!(":(literal){p}"));
    let (_index, call) = match source {
        Source::Worktree => {
            // Nothing untracked (there): the worktree's own diff. Else a
            // copy of the index takes everything, and it is diffed.
            let untracked = git
                .at(&worktree.path)
                .args(["ls-files", "-z", "--others", "--exclude-standard"])
                .arg("--")
                .args(&pathspec)
                .ok()
                .await?;
            if records(&untracked).next().is_none() {
                let call = git
                    .at(&worktree.path)
                    .args(["diff", "--merge-base", &base_ref]);
                (None, call)
            } else {
                let index = TempIndex::copy(git, worktree)?;
                git.at(&worktree.path)
                    .index(&index.path)
                    .config("index.skipHash=true")
                    .args(["add", "-A", "--"])
                    .args(&pathspec)
                    .ok()
                    .await?;
                let call = git.at(&worktree.path).index(&index.path).args([
                    "diff",
                    "--cached",
                    "--merge-base",
                    &base_ref,
                ]);
                (Some(index), call)
            }
        }
        Source::Branch => {
            let call = git.at(&worktree.repository).args([
                "diff",
                "--merge-base",
                &base_ref,
                &format!("refs/heads/{}", worktree.branch),
            ]);
            (None, call)
        }
    };
    let call = call.args(options).arg("--").args(pathspec);
    let what = call.what();
    let mut child = call.start()?;
    let mut stderr = child.child_mut().stderr.take().expect("piped");
    let errors = tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut text).await;
        text
    });
    let mut stdout = child.child_mut().stdout.take().expect("piped");
    let mut text = Vec::with_capacity(max_bytes.min(1 << 20) + 1);
    let read = (&mut stdout)
        .take(max_bytes as u64 + 1)
        .read_to_end(&mut text)
        .await;
    read.map_err(|e| GitError::Failed(format!("{what} failed: cannot read its output: {e}")))?;
    if text.len() > max_bytes {
        // More follows: stop git and cut at the last line's end that fits.
        drop(stdout);
        child.kill();
        child.wait().await;
        errors.abort();
        let end = text[..max_bytes]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        text.truncate(end);
        return Ok(Diff {
            text: lossy(&text),
            truncated: true,
        });
    }
    let status = child.wait().await;
    let stderr = errors.await.unwrap_or_default();
    if !status.success() {
        return Err(super::failure(
            &what,
            &std::process::Output {
                status,
                stdout: Vec::new(),
                stderr,
            },
        ));
    }
    Ok(Diff {
        text: lossy(&text),
        truncated: false,
    })
}

impl Git {
    /// What differs from the base.
    pub async fn changes(&self, worktree: &Worktree, source: Source) -> Result<Changes, GitError> {
        match changes(self, worktree, source).await {
            Err(GitError::Failed(why)) => Err(self.gone_or_failed(worktree, why).await),
            done => done,
        }
    }

    /// The unified diff against the merge base, of one file or all.
    pub async fn diff(
        &self,
        worktree: &Worktree,
        source: Source,
        path: Option<&str>,
        max_bytes: usize,
    ) -> Result<Diff, GitError> {
        match diff(self, worktree, source, path, max_bytes).await {
            Err(GitError::Failed(why)) => Err(self.gone_or_failed(worktree, why).await),
            done => done,
        }
    }
}
