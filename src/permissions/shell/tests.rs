//! Unit tests of the splitter's own machinery (the parse deadline, the parts'
//! fields); the rules' view of many more lines is tested in
//! `tests/suite/policies.rs` and `tests/suite/hostile_input.rs`.

use super::walk::expanding_heredoc_delimiter;
use super::words::{ansi_c, decode_ansi_c_quotes};

use super::*;

#[test]
fn a_late_parse_is_given_up_and_counted_until_it_ends() {
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    let late = within(std::time::Duration::from_millis(10), move || {
        let _ = wait.recv();
        let _ = done_tx.send(());
    });
    assert!(late.is_none());
    assert!(OVERDUE.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    release.send(()).unwrap();
    done.recv_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    assert_eq!(within(std::time::Duration::from_secs(10), || 7), Some(7));
}

#[test]
fn parts_show_the_unwrapped_command_its_program_and_what_is_unseen() {
    let parts = parse_line("sudo -u me env A=1 /usr/bin/git status > out.txt && ./gradlew build");
    let shown: Vec<(&str, &str, bool)> = parts
        .iter()
        .map(|p| (p.text.as_str(), p.program.as_str(), p.wrapper))
        .collect();
    assert_eq!(
        shown,
        [
            (
                "sudo -u me env A=1 /usr/bin/git status > out.txt",
                "sudo",
                false
            ),
            ("env A=1 /usr/bin/git status > out.txt", "env", true),
            ("git status > out.txt", "git", false),
            ("./gradlew build", "./gradlew", false),
        ]
    );
    assert_eq!(parts[3].also, ["gradlew build"]);
    assert_eq!(ansi_c(r"\x72\155\u00e9\n\q"), "rmé\n\\q");
    assert_eq!(decode_ansi_c_quotes(r"a $'\x72m' b"), "a rm b");
    assert_eq!(
        parse_line("ls 'x")[0].also,
        ["ls x", "x"],
        "unparsed text: every run of words"
    );
    assert!(expanding_heredoc_delimiter("cat <<e$( <<f${"));
    assert!(!expanding_heredoc_delimiter(
        "cat <<'EOF'\n$x\nEOF\n <<< $y"
    ));
}
