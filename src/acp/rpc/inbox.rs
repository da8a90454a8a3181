//! The receiving end of the incoming channel: requests and notifications
//! in arrival order, each marked done with once the layer above has dealt
//! with it, so the connection knows how far its stream is processed
//! ([`RpcPeer::processed_to`](super::RpcPeer::processed_to)).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::shared::Connection;

/// Incoming messages, in the order they arrived.
pub struct Inbox<I> {
    rx: mpsc::Receiver<(I, u64)>,
    shared: Arc<Connection>,
    /// Where the message received last begins, until it is done with.
    in_hand: Option<u64>,
}

impl<I> Inbox<I> {
    pub(super) fn new(rx: mpsc::Receiver<(I, u64)>, shared: Arc<Connection>) -> Inbox<I> {
        Inbox {
            rx,
            shared,
            in_hand: None,
        }
    }

    /// The next message (`None` once the connection is closed and all is
    /// received). Asking for the next one says the one before is done with.
    /// Cancel-safe.
    pub async fn recv(&mut self) -> Option<I> {
        self.done();
        let (message, start) = self.rx.recv().await?;
        self.in_hand = Some(start);
        Some(message)
    }

    /// The next message if one is waiting (see [`Inbox::recv`]).
    pub fn try_recv(&mut self) -> Result<I, mpsc::error::TryRecvError> {
        self.done();
        let (message, start) = self.rx.try_recv()?;
        self.in_hand = Some(start);
        Ok(message)
    }

    /// The message received last is dealt with (its effects are where
    /// they must be before its place in the stream is let go).
    pub fn done(&mut self) {
        if let Some(start) = self.in_hand.take() {
            self.shared.state().ledger.done(start);
        }
    }
}
