//! Git, and nothing of sessions: a conversation's worktree made on a
//! repository, what differs in it from its base, and committing, landing
//! and discarding that work. The `changes` routes and the session call
//! this; the box is told what to grant from [`box_paths`].
//!
//! Everything runs git itself (the CLI, [`Git::program`]): its porcelain
//! for what a person would do in a working tree (`worktree add`, `merge
//! --ff-only`, `reset`, `clean`), its plumbing where nothing may change
//! until the result is known (`merge-tree`, `commit-tree`, `update-ref`
//! with the old value; a rebase is replayed with them), and its
//! machine-readable output (`-z`). Git's on-disk formats are never read
//! here; what would change a worktree's index is done on a copy of it
//! (`GIT_INDEX_FILE`), which replaces it only once a commit is made.
//!
//! Files: this one runs git and makes and removes worktrees; `changes`
//! reads what differs (files, commits, the diff); `land` commits and
//! lands.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Mutex;

use tokio::io::AsyncWriteExt;

use crate::model::{BranchCommit, LandStrategy, Signature, Worktree};
use crate::process::child::Supervised;
use crate::sys::SystemUser;

mod changes;
mod current;
mod land;
mod to_error;
mod worktree;
#[cfg(test)]
mod tests;

/// How git is run: which program, and as whom.
#[derive(Debug, Clone)]
pub struct Git {
    /// The git program (the configuration's `git`, default `git` on `PATH`).
    pub program: PathBuf,
    /// The user git runs as when the gateway runs as root (the agent's):
    /// what it writes in a worktree is theirs.
    pub user: Option<SystemUser>,
}

/// Why git did not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    /// 422: the path is not a git repository.
    #[error("{0}")]
    NotARepository(String),
    /// 422: no such base branch (or commit).
    #[error("{0}")]
    UnknownBase(String),
    /// 422: not a valid branch name, or one the box cannot confine.
    #[error("{0}")]
    InvalidBranch(String),
    /// 409 `branch_exists`.
    #[error("{0}")]
    BranchExists(String),
    /// 409 `uncommitted_changes`: the tree named has uncommitted changes
    /// (its files, relative to it).
    #[error("{tree} has uncommitted changes: {}", files.join(", "))]
    Dirty { tree: String, files: Vec<String> },
    /// 409 `conflict`: the branch does not land cleanly (these files).
    #[error("the branch conflicts with its base in {}", files.join(", "))]
    Conflict { files: Vec<String> },
    /// 409 `nothing_to_commit`.
    #[error("nothing to commit: the worktree is as its last commit")]
    NothingToCommit,
    /// 409 `nothing_to_land`: the base has everything the branch has.
    #[error("nothing to land: {0}")]
    NothingToLand(String),
    /// 409 `repository_busy`: another land, commit or discard on this
    /// repository runs (or git's own lock is held); nothing changed.
    #[error("{0}")]
    Busy(String),
    /// 409 `base_moved`: the base changed while landing; nothing changed.
    #[error("{0}")]
    BaseMoved(String),
    /// 409 `branch_gone`: the conversation's branch or its base is no
    /// longer in the repository (deleted since: a close that discarded it).
    #[error("{0}")]
    Gone(String),
    /// 400: a path that leads out of the worktree.
    #[error("{0}")]
    BadPath(String),
    /// 502: the repository or worktree is not there (on this node) or git
    /// failed on it (locked or broken worktree metadata, say); says which
    /// and git's own words.
    #[error("{0}")]
    Failed(String),
}

impl GitError {
    /// A failure because git's own lock was held becomes [`GitError::Busy`].
    fn busy_if_locked(self) -> GitError {
        match self {
            GitError::Failed(message) if mentions_a_lock(&message) => GitError::Busy(message),
            other => other,
        }
    }
}

/// Whether git's words say a lock file was in the way.
fn mentions_a_lock(stderr: &str) -> bool {
    stderr.contains("index.lock")
        || stderr.contains("File exists")
        || (stderr.contains("Unable to create") && stderr.contains(".lock"))
}

/// Where a worktree's changes are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The worktree, uncommitted and untracked files included.
    Worktree,
    /// The branch alone (the worktree is gone: the conversation is closed).
    Branch,
}

/// A unified diff, cut at a number of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    pub text: String,
    /// More followed (cut at a line's end at or before the limit).
    pub truncated: bool,
}

/// What a land did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    pub strategy: LandStrategy,
    /// The base's commit before and after.
    pub from: String,
    pub to: String,
    /// Where the base is checked out (that tree shows the result); `None`:
    /// nowhere, its branch was moved.
    pub working_tree: Option<PathBuf>,
}

/// What the agent's box must grant for git to work in a worktree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoxPaths {
    pub read_write: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
}

/// At most this much of git's stderr is told.
const STDERR_LIMIT: usize = 2000;

/// One git invocation being put together (see [`Git::at`]).
pub(crate) struct Call<'a> {
    git: &'a Git,
    dir: PathBuf,
    /// `-c` settings of this call alone.
    config: Vec<&'static str>,
    args: Vec<OsString>,
    env: Vec<(&'static str, OsString)>,
    input: Option<Vec<u8>>,
}

impl<'a> Call<'a> {
    fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// `-c name=value` for this call.
    fn config(mut self, setting: &'static str) -> Self {
        self.config.push(setting);
        self
    }

    fn env(mut self, name: &'static str, value: impl AsRef<OsStr>) -> Self {
        self.env.push((name, value.as_ref().to_owned()));
        self
    }

    /// GIT_INDEX_FILE.
    fn index(self, index: &Path) -> Self {
        self.env("GIT_INDEX_FILE", index)
    }

    fn author(self, who: &Signature) -> Self {
        self.env("GIT_AUTHOR_NAME", &who.name)
            .env("GIT_AUTHOR_EMAIL", &who.email)
    }

    fn committer(self, who: &Signature) -> Self {
        self.env("GIT_COMMITTER_NAME", &who.name)
            .env("GIT_COMMITTER_EMAIL", &who.email)
    }

    /// Fed to git's stdin.
    fn input(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.input = Some(input.into());
        self
    }

    /// What the failure names: `git worktree add in /srv/repos/app`.
    fn what(&self) -> String {
        let words: Vec<String> = self
            .args
            .iter()
            .take_while(|a| !a.to_string_lossy().starts_with('-'))
            .take(if self.args.first().is_some_and(|a| a == "worktree") {
                2
            } else {
                1
            })
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        format!("git {} in {}", words.join(" "), self.dir.display())
    }

    fn command(&self) -> Result<tokio::process::Command, GitError> {
        let mut command = tokio::process::Command::new(&self.git.program);
        command.args([
            "-c",
            "safe.directory=*",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "gc.auto=0",
        ]);
        for setting in &self.config {
            command.args(["-c", setting]);
        }
        command
            .arg("-C")
            .arg(&self.dir)
            .args(&self.args)
            .env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        command
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("HOME", "/")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(if self.input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(user) = self
            .git
            .user
            .as_ref()
            .filter(|_| crate::sys::running_as_root())
        {
            crate::sandbox::capabilities::Shedding::new(
                crate::sandbox::capabilities::CapSet::EMPTY,
                Some(user),
                None,
            )
            .map_err(|e| GitError::Failed(format!("cannot run git as {user}: {e}")))?
            .on_child(&mut command);
        }
        Ok(command)
    }

    fn spawn_failed(&self, e: std::io::Error) -> GitError {
        GitError::Failed(format!(
            "{} failed: cannot run {}: {e}",
            self.what(),
            self.git.program.display()
        ))
    }

    /// Starts it as the gateway starts every process of its own (see
    /// [`crate::process::spawn`]: registered, so that the gateway's sweep
    /// for orphans never takes it for one; killed with what it started when
    /// dropped).
    fn start(&self) -> Result<Supervised, GitError> {
        let mut command = self.command()?;
        Supervised::spawn(&mut command).map_err(|e| self.spawn_failed(e))
    }

    /// Runs it, whatever its exit status.
    async fn output(self) -> Result<Output, GitError> {
        use tokio::io::AsyncReadExt;
        let mut child = self.start()?;
        let stdin = child.child_mut().stdin.take();
        let mut stdout = child.child_mut().stdout.take().expect("piped");
        let mut stderr = child.child_mut().stderr.take().expect("piped");
        let input = self.input.clone();
        let feed = async move {
            if let (Some(mut stdin), Some(input)) = (stdin, input) {
                // A git that does not read it all fails on its own.
                let _ = stdin.write_all(&input).await;
            }
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let ((), read_out, read_err) = tokio::join!(
            feed,
            stdout.read_to_end(&mut out),
            stderr.read_to_end(&mut err)
        );
        read_out.map_err(|e| self.spawn_failed(e))?;
        read_err.map_err(|e| self.spawn_failed(e))?;
        let status = child.wait().await;
        Ok(Output {
            status,
            stdout: out,
            stderr: err,
        })
    }

    /// Runs it; its stdout if it succeeded, else [`GitError::Failed`]
    /// naming it with git's words.
    async fn ok(self) -> Result<Vec<u8>, GitError> {
        let what = self.what();
        let output = self.output().await?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(failure(&what, &output))
        }
    }

    /// Its stdout's first line, trimmed.
    async fn text(self) -> Result<String, GitError> {
        let out = self.ok().await?;
        Ok(first_line(&out))
    }

    /// Whether it succeeded (for `--verify --quiet`, `--is-ancestor`: an
    /// exit status of 1 is an answer); its first line if so.
    async fn answer(self) -> Result<Option<String>, GitError> {
        let what = self.what();
        let output = self.output().await?;
        match output.status.code() {
            Some(0) => Ok(Some(first_line(&output.stdout))),
            Some(1) if output.stderr.trim_ascii().is_empty() => Ok(None),
            _ => Err(failure(&what, &output)),
        }
    }
}

fn first_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// `git … in … failed: <git's stderr, trimmed>`.
fn failure(what: &str, output: &Output) -> GitError {
    GitError::Failed(format!("{what} failed: {}", stderr_of(output)))
}

fn stderr_of(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr);
    let text = text.trim();
    let text = if text.is_empty() {
        match output.status.code() {
            Some(code) => format!("exit status {code}"),
            None => "killed by a signal".to_owned(),
        }
    } else {
        text.to_owned()
    };
    cut(text, STDERR_LIMIT)
}

/// At most `limit` bytes, at a character's boundary.
fn cut(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// Splits `-z` output into its NUL-terminated records.
fn records(out: &[u8]) -> impl Iterator<Item = &[u8]> {
    let out = out.strip_suffix(b"\0").unwrap_or(out);
    out.split(|b| *b == 0).filter(|_| !out.is_empty())
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The repositories (by common directory) where a commit, land or discard
/// runs now in this process.
static RUNNING: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// Holds a repository for one commit, land or discard; lets go when dropped.
struct RepositoryHeld(PathBuf);

impl RepositoryHeld {
    fn take(worktree: &Worktree) -> Result<RepositoryHeld, GitError> {
        let key = PathBuf::from(&worktree.common_dir);
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if !running.get_or_insert_with(HashSet::new).insert(key.clone()) {
            return Err(GitError::Busy(format!(
                "another land, commit or discard runs on {}",
                worktree.repository
            )));
        }
        Ok(RepositoryHeld(key))
    }
}

impl Drop for RepositoryHeld {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = running.as_mut() {
            running.remove(&self.0);
        }
    }
}

/// A copy of a worktree's index in its git directory, removed when dropped
/// (unless it was made the index).
struct TempIndex {
    path: PathBuf,
    kept: bool,
}

impl TempIndex {
    fn copy(git: &Git, worktree: &Worktree) -> Result<TempIndex, GitError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let git_dir = Path::new(&worktree.git_dir);
        let path = git_dir.join(format!(
            "acp-index-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let temp = TempIndex { path, kept: false };
        let index = git_dir.join("index");
        let failed = |e: std::io::Error| {
            GitError::Failed(format!(
                "cannot copy the index of the worktree {} ({}): {e}",
                worktree.path,
                index.display()
            ))
        };
        match std::fs::copy(&index, &temp.path) {
            Ok(_) => {}
            // A worktree without an index yet: git makes one.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && git_dir.is_dir() => {
                return Ok(temp)
            }
            Err(e) => return Err(failed(e)),
        }
        if let Some(user) = git.user.as_ref().filter(|_| crate::sys::running_as_root()) {
            std::os::unix::fs::chown(&temp.path, Some(user.uid), Some(user.gid)).map_err(failed)?;
        }
        Ok(temp)
    }
}

impl Drop for TempIndex {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
            let mut lock = self.path.clone().into_os_string();
            lock.push(".lock");
            let _ = std::fs::remove_file(lock);
        }
    }
}

/// The ref folder a branch lies in (`acp` for `acp/1a2b3c4d`).
fn branch_folder(branch: &str) -> Option<&str> {
    branch.rsplit_once('/').map(|(folder, _)| folder)
}

/// What a worktree that is not there answers.
fn unreachable(worktree: &Worktree, source: Source) -> Option<GitError> {
    let gone = |p: &str| !Path::new(p).is_dir();
    let missing = match source {
        Source::Worktree => gone(&worktree.path) || gone(&worktree.git_dir),
        Source::Branch => false,
    } || gone(&worktree.common_dir);
    missing.then(|| {
        GitError::Failed(format!(
            "the worktree {} (or its repository {}) is not reachable from this node",
            worktree.path, worktree.repository
        ))
    })
}

/// Files named by `git status --porcelain=v1 -z`.
fn status_files(out: &[u8]) -> Vec<String> {
    let mut files = Vec::new();
    let mut records = records(out);
    while let Some(record) = records.next() {
        if record.len() < 4 {
            continue;
        }
        files.push(lossy(&record[3..]));
        // A rename or copy names where it came from next.
        if matches!(record[0], b'R' | b'C') || matches!(record[1], b'R' | b'C') {
            records.next();
        }
    }
    files
}

fn canonical(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_owned())
        .to_string_lossy()
        .into_owned()
}

impl Git {
    pub fn new(program: impl Into<PathBuf>) -> Git {
        Git {
            program: program.into(),
            user: None,
        }
    }

    /// The same, run as `user` when the gateway runs as root.
    pub fn run_as(&self, user: Option<SystemUser>) -> Git {
        Git {
            program: self.program.clone(),
            user,
        }
    }

    /// A git command run in `dir`.
    fn at(&self, dir: impl AsRef<Path>) -> Call<'_> {
        Call {
            git: self,
            dir: dir.as_ref().to_owned(),
            config: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            input: None,
        }
    }

    /// A commit's id, if `rev` names one.
    async fn commit_id(&self, dir: &Path, rev: &str) -> Result<Option<String>, GitError> {
        self.at(dir)
            .args(["rev-parse", "--verify", "--quiet"])
            .arg(format!("{rev}^{{commit}}"))
            .answer()
            .await
    }

    /// Resets the worktree to its last commit; the commit's id.
    pub async fn discard(&self, worktree: &Worktree) -> Result<String, GitError> {
        if let Some(e) = unreachable(worktree, Source::Worktree) {
            return Err(e);
        }
        let _held = RepositoryHeld::take(worktree)?;
        let run = async {
            self.at(&worktree.path)
                .args(["reset", "-q", "--hard", "HEAD"])
                .ok()
                .await?;
            self.at(&worktree.path).args(["clean", "-fdq"]).ok().await?;
            self.at(&worktree.path)
                .args(["rev-parse", "--verify", "HEAD"])
                .text()
                .await
        };
        run.await.map_err(GitError::busy_if_locked)
    }
}

/// What a worktree's box grants (pure).
pub fn box_paths(worktree: &Worktree) -> BoxPaths {
    let common = Path::new(&worktree.common_dir);
    let mut read_write = vec![
        PathBuf::from(&worktree.path),
        PathBuf::from(&worktree.git_dir),
        common.join("objects"),
    ];
    if let Some(folder) = branch_folder(&worktree.branch) {
        read_write.push(common.join("refs/heads").join(folder));
        read_write.push(common.join("logs/refs/heads").join(folder));
    }
    BoxPaths {
        read_write,
        read_only: vec![common.to_owned()],
    }
}

/// Makes the directories [`box_paths`] names that git may have removed
/// (an emptied ref folder), so that the box can be made.
pub fn prepare_box(worktree: &Worktree) -> std::io::Result<()> {
    let common = Path::new(&worktree.common_dir);
    let Some(folder) = branch_folder(&worktree.branch) else {
        return Ok(());
    };
    for top in ["refs/heads", "logs/refs/heads"] {
        let top = common.join(top);
        let dir = top.join(folder);
        if dir.is_dir() {
            continue;
        }
        std::fs::create_dir_all(&dir)?;
        // Made by the gateway: the folders it made belong to whom
        // `refs/heads` belongs to (the repository's owner), as git's own.
        if crate::sys::running_as_root() {
            use std::os::unix::fs::MetadataExt;
            let owner = std::fs::metadata(common.join("refs/heads"))?;
            let mut made = dir.as_path();
            while made != top && made.starts_with(&top) {
                std::os::unix::fs::lchown(made, Some(owner.uid()), Some(owner.gid()))?;
                match made.parent() {
                    Some(parent) => made = parent,
                    None => break,
                }
            }
            if top.ends_with("logs/refs/heads") {
                // logs/refs/heads itself may have been made just now.
                for made in [
                    common.join("logs/refs/heads"),
                    common.join("logs/refs"),
                    common.join("logs"),
                ] {
                    std::os::unix::fs::lchown(&made, Some(owner.uid()), Some(owner.gid()))?;
                }
            }
        }
    }
    Ok(())
}

/// `git log -z --format=%H%x1f%an%x1f%aI%x1f%s`.
fn parse_log(out: &[u8]) -> Result<Vec<BranchCommit>, GitError> {
    records(out)
        .map(|record| {
            let record = lossy(record);
            let mut parts = record.splitn(4, '\u{1f}');
            let (id, author, date, summary) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            let authored_at = chrono::DateTime::parse_from_rfc3339(date)
                .map_err(|e| {
                    GitError::Failed(format!("git log gave a date {date:?} of {id}: {e}"))
                })?
                .with_timezone(&chrono::Utc);
            Ok(BranchCommit {
                id: id.trim().to_owned(),
                summary: summary.to_owned(),
                author: author.to_owned(),
                authored_at,
            })
        })
        .collect()
}

/// [`GitError::Gone`] for the worktree's `branch` (or base).
fn gone(worktree: &Worktree, branch: &str) -> GitError {
    GitError::Gone(format!(
        "{} has no branch {branch:?} any more",
        worktree.repository
    ))
}

impl Git {
    /// Why reading a worktree's changes failed: its branch or base gone
    /// from the repository ([`GitError::Gone`]), else git's own words.
    async fn gone_or_failed(&self, worktree: &Worktree, why: String) -> GitError {
        let repo = Path::new(&worktree.repository);
        for branch in [&worktree.branch, &worktree.base] {
            if let Ok(None) = self.commit_id(repo, &format!("refs/heads/{branch}")).await {
                return gone(worktree, branch);
            }
        }
        GitError::Failed(why)
    }
}
