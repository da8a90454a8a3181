//! Files that change under the gateway while it reaches them: a workspace
//! whose symlinks and directories flip between inside and outside.

use std::path::{Path, PathBuf};

/// A workspace whose ways out flip while files are reached through it: a
/// race that would lead a read or a write outside. Inside `work`: `dir` and `last`, symlinks retargeted
/// between `sub/` (or `sub/secret.txt`) and the same outside; `swapped`, a
/// real directory exchanged in place with a symlink to `outside`; and
/// `file.txt`, a real file exchanged with a symlink to `outside/secret.txt`
/// (`renameat2(RENAME_EXCHANGE)`: the name always exists). Everything
/// inside reads `inside\n`; `outside/secret.txt` reads `outside\n`.
pub struct Flipping {
    pub work: PathBuf,
    pub outside: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Flipping {
    pub fn start(work: &Path, outside: &Path) -> Flipping {
        let (w, o) = (work.to_path_buf(), outside.to_path_buf());
        std::fs::create_dir_all(w.join("sub")).unwrap();
        std::fs::create_dir_all(w.join("swapped")).unwrap();
        std::fs::create_dir_all(&o).unwrap();
        std::fs::write(w.join("sub/secret.txt"), "inside\n").unwrap();
        std::fs::write(w.join("swapped/secret.txt"), "inside\n").unwrap();
        std::fs::write(w.join("file.txt"), "inside\n").unwrap();
        std::fs::write(o.join("secret.txt"), "outside\n").unwrap();
        let symlink =
            |target: &Path, link: &Path| std::os::unix::fs::symlink(target, link).unwrap();
        symlink(Path::new("sub"), &w.join("dir"));
        symlink(&w.join("sub/secret.txt"), &w.join("last"));
        symlink(&o, &w.join("swapped.other"));
        symlink(&o.join("secret.txt"), &w.join("file.txt.other"));
        let retargets = [
            (w.join("dir"), PathBuf::from("sub"), o.clone()),
            (
                w.join("last"),
                w.join("sub/secret.txt"),
                o.join("secret.txt"),
            ),
        ];
        let exchanges = [
            (w.join("swapped"), w.join("swapped.other")),
            (w.join("file.txt"), w.join("file.txt.other")),
        ];
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut flips = 0;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                for (link, inside, outside) in &retargets {
                    let target = if flips % 2 == 0 { outside } else { inside };
                    let temp = link.with_extension("flipping");
                    let _ = std::fs::remove_file(&temp);
                    // Gone (the test ended early): nothing left to flip.
                    if std::os::unix::fs::symlink(target, &temp).is_err()
                        || std::fs::rename(&temp, link).is_err()
                    {
                        return flips;
                    }
                }
                for (a, b) in &exchanges {
                    let a = std::ffi::CString::new(a.as_os_str().as_encoded_bytes()).unwrap();
                    let b = std::ffi::CString::new(b.as_os_str().as_encoded_bytes()).unwrap();
                    // SAFETY: NUL-terminated paths.
                    let exchanged = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    if exchanged != 0 {
                        return flips;
                    }
                }
                flips += 1;
            }
            flips
        });
        Flipping {
            work: w,
            outside: o,
            stop,
            thread: Some(thread),
        }
    }

    /// What to read: each must read `inside\n`, or be refused.
    pub fn reads(&self) -> [PathBuf; 4] {
        let w = &self.work;
        [
            w.join("dir/secret.txt"),
            w.join("last"),
            w.join("swapped/secret.txt"),
            w.join("file.txt"),
        ]
    }

    /// What to write in round `round`: each must land inside, or be refused.
    pub fn writes(&self, round: usize) -> [(PathBuf, &'static str); 3] {
        let w = &self.work;
        [
            (w.join(format!("dir/new-{}.txt", round % 4)), "new\n"),
            (w.join("last"), "inside\n"),
            (w.join(format!("swapped/new-{}.txt", round % 4)), "new\n"),
        ]
    }

    /// Stops flipping; how many rounds of flips there were.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }

    /// Nothing outside was written, and nothing was left there.
    pub fn assert_outside_untouched(&self) {
        let left: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["secret.txt"], "left outside");
        assert_eq!(
            std::fs::read_to_string(self.outside.join("secret.txt")).unwrap(),
            "outside\n"
        );
    }
}

impl Drop for Flipping {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
