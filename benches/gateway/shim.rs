//! The shim's cost per agent (the process that keeps an agent running
//! across gateway restarts): a
//! real `acp-gateway shim` over an agent that writes `lines` lines of a
//! typical streamed chunk, read through the gateway's link and
//! acknowledged as it comes. Reported: the shim's resident memory idle and
//! at its peak, and its CPU time per 1,000 lines.

use std::process::Stdio;
use std::time::{Duration, Instant};

use acp_gateway::acp::link::{self, Ending};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::common::proc_status_kib;

/// One line as an agent streams a chunk of text.
const LINE: &str = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"w123 "}}}}"#;

/// Clock ticks a second, as `/proc/<pid>/stat` counts CPU time.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// The CPU time (user + system) `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15; after the `)`, 12 and 13.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    Duration::from_secs_f64(ticks as f64 / ticks_per_second())
}

pub async fn cost(lines: usize) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("shim.sock");
    let script = format!("read go; yes '{LINE}' | head -n {lines}");
    let mut shim = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .arg("shim")
        .arg("--socket")
        .arg(&socket)
        .arg("--peer-uid")
        .arg(unsafe { libc::geteuid() }.to_string())
        .arg("--")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = shim.id().unwrap();
    let mut ready = BufReader::new(shim.stdout.take().unwrap()).lines();
    ready.next_line().await.unwrap().expect("the shim is ready");
    let (stderr, _stderr) = tokio::sync::mpsc::channel(8);
    let mut agent = link::attach(&socket, |hello| hello.held_from, stderr)
        .await
        .unwrap();
    let idle_kib = proc_status_kib(pid, "VmRSS:");
    let cpu_before = cpu_time(pid);
    let started = Instant::now();
    use tokio::io::AsyncWriteExt;
    agent.input.write_all(b"go\n").await.unwrap();
    let expected = (LINE.len() + 1) * lines;
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0usize;
    while read < expected {
        let n = agent.output.read(&mut buf).await.unwrap();
        assert!(n > 0, "the shim ended the output early");
        read += n;
        agent.control.acknowledge(agent.control.delivered());
    }
    let elapsed = started.elapsed();
    // Before it goes: what it used.
    let cpu = cpu_time(pid).saturating_sub(cpu_before);
    let peak_kib = proc_status_kib(pid, "VmHWM:");
    match agent.control.ended().await {
        Ending::Exited(exit) => assert_eq!(exit.code, Some(0)),
        other => panic!("{other:?}"),
    }
    agent.control.acknowledge(agent.control.delivered());
    let _ = tokio::time::timeout(Duration::from_secs(10), shim.wait()).await;
    println!(
        "[shim] {lines} lines ({:.1} MB) through a shim in {:.3} s = {:.0} lines/s; shim RSS idle {:.1} MiB, peak {:.1} MiB; shim CPU {:.3} ms per 1,000 lines",
        expected as f64 / 1e6,
        elapsed.as_secs_f64(),
        lines as f64 / elapsed.as_secs_f64(),
        idle_kib as f64 / 1024.0,
        peak_kib as f64 / 1024.0,
        cpu.as_secs_f64() * 1000.0 / (lines as f64 / 1000.0),
    );
}
