//! What a shim and a gateway say on the shim's socket: frames of a 4-byte
//! big-endian length, then one byte naming the kind, then its body.
//!
//! The agent's output is one byte stream numbered from 0: every [`Output`]
//! frame says at which offset its bytes start, so a gateway that attaches
//! again says from where it wants them ([`ToShim::Attach`]) and gets exactly
//! what follows, nothing twice. The gateway's writes to the agent are
//! numbered the same way ([`ToShim::Input`]): bytes the shim has already
//! taken are skipped, so what a gateway sends again after a reconnect
//! reaches the agent once.
//!
//! [`Output`]: ToGateway::Output

use std::io;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The protocol's version, said in [`Hello`]. Version 2 added
/// [`ToShim::Auth`]: a gateway proves it may use the shim before anything
/// else it sends counts.
pub const VERSION: u32 = 2;
/// The oldest version a gateway still speaks (a shim started by an earlier
/// gateway, reattached after an upgrade).
pub const OLDEST_VERSION: u32 = 1;
/// Most bytes of output one frame carries.
pub const MAX_OUTPUT_CHUNK: usize = 64 * 1024;
/// Largest frame either side accepts (a prompt with images is one line of
/// input).
pub const MAX_FRAME: usize = 64 * 1024 * 1024 + 16;

const HELLO: u8 = 1;
const OUTPUT: u8 = 2;
const STDERR: u8 = 3;
const EXIT: u8 = 4;
const REFUSED: u8 = 5;
const ATTACH: u8 = 10;
const INPUT: u8 = 11;
const ACK: u8 = 12;
const STOP: u8 = 13;
const AUTH: u8 = 14;

/// What a shim says first to each gateway that connects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    /// The agent's pid (its process group's too).
    pub pid: i32,
    /// The agent's start time (`/proc`), which with the pid tells it from a
    /// later process with the same pid.
    pub start_time: Option<u64>,
    /// The first byte of output the shim still holds: everything before it
    /// has been acknowledged.
    pub held_from: u64,
    /// How much output the shim has read from the agent.
    pub read_to: u64,
    /// How much input the shim has taken for the agent: a gateway numbers
    /// its next bytes from here.
    pub input_taken: u64,
    /// How the agent ended, once it has and all its output is read.
    pub exit: Option<Exit>,
}

/// How an agent ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Its last lines on stderr.
    pub stderr_tail: String,
}

/// From the shim to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToGateway {
    Hello(Hello),
    /// The agent's output from `offset` on.
    Output {
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Some of what the agent wrote to stderr, as it comes (not kept for a
    /// later gateway: the tail is in [`Exit`]).
    Stderr(Vec<u8>),
    /// The agent has ended and every byte of its output has been sent.
    Exit(Exit),
    /// The shim will not serve this request; it closes the connection.
    Refused(String),
}

/// From the gateway to the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToShim {
    /// Acknowledges everything before `from` and asks for the output from it.
    Attach { from: u64 },
    /// Bytes for the agent's stdin, the first of them at input `offset`.
    Input { offset: u64, bytes: Vec<u8> },
    /// Everything before `to` is safe with the gateway: the shim lets it go.
    Ack { to: u64 },
    /// Stop the agent: SIGTERM, and after `grace_ms` SIGKILL.
    Stop { grace_ms: u32 },
    /// The shim's key (from the file beside its socket, which no agent's box
    /// reaches): a connection's first frame, without which a shim that has
    /// a key serves nothing. A shim that takes it says hello again, as
    /// things then stand: that hello is the one to attach by.
    Auth { key: Vec<u8> },
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn offset_and_bytes(body: &[u8]) -> io::Result<(u64, Vec<u8>)> {
    let (offset, bytes) = body
        .split_first_chunk::<8>()
        .ok_or_else(|| invalid("a frame too short for its offset"))?;
    Ok((u64::from_be_bytes(*offset), bytes.to_vec()))
}

fn only_number(body: &[u8]) -> io::Result<u64> {
    let number: [u8; 8] = body
        .try_into()
        .map_err(|_| invalid("a frame of the wrong length"))?;
    Ok(u64::from_be_bytes(number))
}

fn with_offset(offset: u64, bytes: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(8 + bytes.len());
    body.extend_from_slice(&offset.to_be_bytes());
    body.extend_from_slice(bytes);
    body
}

impl ToGateway {
    fn encode(&self) -> (u8, Vec<u8>) {
        match self {
            ToGateway::Hello(hello) => (HELLO, json(hello)),
            ToGateway::Output { offset, bytes } => (OUTPUT, with_offset(*offset, bytes)),
            ToGateway::Stderr(bytes) => (STDERR, bytes.clone()),
            ToGateway::Exit(exit) => (EXIT, json(exit)),
            ToGateway::Refused(why) => (REFUSED, why.as_bytes().to_vec()),
        }
    }

    fn decode(kind: u8, body: Vec<u8>) -> io::Result<ToGateway> {
        Ok(match kind {
            HELLO => ToGateway::Hello(parse(&body)?),
            OUTPUT => {
                let (offset, bytes) = offset_and_bytes(&body)?;
                ToGateway::Output { offset, bytes }
            }
            STDERR => ToGateway::Stderr(body),
            EXIT => ToGateway::Exit(parse(&body)?),
            REFUSED => ToGateway::Refused(String::from_utf8_lossy(&body).into_owned()),
            other => return Err(invalid(format!("unknown frame kind {other} from a shim"))),
        })
    }
}

impl ToShim {
    fn encode(&self) -> (u8, Vec<u8>) {
        match self {
            ToShim::Attach { from } => (ATTACH, from.to_be_bytes().to_vec()),
            ToShim::Input { offset, bytes } => (INPUT, with_offset(*offset, bytes)),
            ToShim::Ack { to } => (ACK, to.to_be_bytes().to_vec()),
            ToShim::Stop { grace_ms } => (STOP, u64::from(*grace_ms).to_be_bytes().to_vec()),
            ToShim::Auth { key } => (AUTH, key.clone()),
        }
    }

    fn decode(kind: u8, body: Vec<u8>) -> io::Result<ToShim> {
        Ok(match kind {
            ATTACH => ToShim::Attach {
                from: only_number(&body)?,
            },
            INPUT => {
                let (offset, bytes) = offset_and_bytes(&body)?;
                ToShim::Input { offset, bytes }
            }
            ACK => ToShim::Ack {
                to: only_number(&body)?,
            },
            STOP => ToShim::Stop {
                grace_ms: u32::try_from(only_number(&body)?).unwrap_or(u32::MAX),
            },
            AUTH => ToShim::Auth { key: body },
            other => {
                return Err(invalid(format!(
                    "unknown frame kind {other} from a gateway"
                )))
            }
        })
    }
}

fn json<T: Serialize>(body: &T) -> Vec<u8> {
    // Plain structs of numbers and strings: serializing cannot fail.
    serde_json::to_vec(body).expect("protocol bodies serialize")
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(|e| invalid(format!("a bad frame body: {e}")))
}

async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, kind: u8, body: &[u8]) -> io::Result<()> {
    let length = u32::try_from(body.len() + 1).map_err(|_| invalid("a frame too large"))?;
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&length.to_be_bytes());
    head[4] = kind;
    w.write_all(&head).await?;
    w.write_all(body).await?;
    w.flush().await
}

/// The next frame, or `None` at a clean end of the stream.
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut length = [0u8; 4];
    match r.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = u32::from_be_bytes(length) as usize;
    if length == 0 || length > MAX_FRAME {
        return Err(invalid(format!("a frame of {length} bytes")));
    }
    let mut frame = vec![0u8; length];
    r.read_exact(&mut frame).await?;
    let body = frame.split_off(1);
    Ok(Some((frame[0], body)))
}

/// Sends one message to the gateway.
pub async fn send_to_gateway<W: AsyncWrite + Unpin>(w: &mut W, m: &ToGateway) -> io::Result<()> {
    let (kind, body) = m.encode();
    write_frame(w, kind, &body).await
}

/// Sends one message to the shim.
pub async fn send_to_shim<W: AsyncWrite + Unpin>(w: &mut W, m: &ToShim) -> io::Result<()> {
    let (kind, body) = m.encode();
    write_frame(w, kind, &body).await
}

/// The shim's next message (`None`: it closed the connection).
pub async fn read_from_shim<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<ToGateway>> {
    match read_frame(r).await? {
        Some((kind, body)) => ToGateway::decode(kind, body).map(Some),
        None => Ok(None),
    }
}

/// The gateway's next message (`None`: it closed the connection).
pub async fn read_from_gateway<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<ToShim>> {
    match read_frame(r).await? {
        Some((kind, body)) => ToShim::decode(kind, body).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_message_reads_back_as_it_was_sent() {
        let hello = Hello {
            version: VERSION,
            pid: 42,
            start_time: Some(7),
            held_from: 10,
            read_to: 20,
            input_taken: 5,
            exit: None,
        };
        let exit = Exit {
            code: None,
            signal: Some(9),
            stderr_tail: "bye".into(),
        };
        let to_gateway = [
            ToGateway::Hello(hello),
            ToGateway::Output {
                offset: u64::MAX - 1,
                bytes: b"{\"jsonrpc\":\"2.0\"}\n".to_vec(),
            },
            ToGateway::Output {
                offset: 0,
                bytes: vec![],
            },
            ToGateway::Stderr(b"\xff not utf-8".to_vec()),
            ToGateway::Exit(exit),
            ToGateway::Refused("not yours".into()),
        ];
        let to_shim = [
            ToShim::Attach { from: 3 },
            ToShim::Input {
                offset: 9,
                bytes: b"line\n".to_vec(),
            },
            ToShim::Ack { to: 12 },
            ToShim::Stop { grace_ms: 2000 },
            ToShim::Auth {
                key: b"0123abcd".to_vec(),
            },
        ];
        for m in &to_gateway {
            let (kind, body) = m.encode();
            assert_eq!(&ToGateway::decode(kind, body).unwrap(), m);
        }
        for m in &to_shim {
            let (kind, body) = m.encode();
            assert_eq!(&ToShim::decode(kind, body).unwrap(), m);
        }
        // Framed, one after the other, and the end of the stream after.
        let mut wire = Vec::new();
        send_to_gateway(&mut wire, &to_gateway[1]).await.unwrap();
        send_to_shim(&mut wire, &to_shim[1]).await.unwrap();
        let mut r = &wire[..];
        let first = read_from_shim(&mut r).await.unwrap();
        assert_eq!(first.as_ref(), Some(&to_gateway[1]));
        let second = read_from_gateway(&mut r).await.unwrap();
        assert_eq!(second.as_ref(), Some(&to_shim[1]));
        assert_eq!(read_from_shim(&mut r).await.unwrap(), None);
    }

    #[tokio::test]
    async fn bad_frames_are_errors_not_panics() {
        for wire in [
            &[0, 0, 0, 0][..],                    // empty
            &[0xff, 0xff, 0xff, 0xff, 1][..],     // too long
            &[0, 0, 0, 2, ATTACH, 1][..],         // a short number
            &[0, 0, 0, 1, 99][..],                // unknown kind
            &[0, 0, 0, 9, INPUT, 1, 2, 3][..],    // cut short
            &[0, 0, 0, 3, HELLO, b'{', b'}'][..], // a body missing fields
        ] {
            let mut r = wire;
            let read = (
                read_from_gateway(&mut r).await,
                read_from_shim(&mut &wire[..]).await,
            );
            assert!(read.0.is_err() && read.1.is_err(), "{wire:?}: {read:?}");
        }
    }
}
