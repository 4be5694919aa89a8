//! The connections that have not yet said who they are (secret, magic, hello), oldest
//! first. When the tracker holds as many connections as it serves, the oldest of
//! these is closed to make room for the newcomer: idle strangers go first, so that a
//! few thousand silent connections cannot lock real workers out until they time out.

use crate::common::ConnId;
use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::Mutex;

/// Connections still in their greeting.
#[derive(Debug, Default)]
pub(crate) struct Greeting {
    open: Mutex<VecDeque<(ConnId, TcpStream)>>,
}

impl Greeting {
    /// Notes that connection `conn` has started its greeting on `stream`.
    pub(crate) fn enter(&self, conn: ConnId, stream: &TcpStream) {
        // Without a second handle it cannot be evicted; it still ends by its timeout.
        if let (Ok(handle), Ok(mut open)) = (stream.try_clone(), self.open.lock()) {
            open.push_back((conn, handle));
        }
    }

    /// Notes that connection `conn` has said who it is, or ended.
    pub(crate) fn leave(&self, conn: ConnId) {
        if let Ok(mut open) = self.open.lock() {
            open.retain(|(c, _)| *c != conn);
        }
    }

    /// Closes the oldest connection still in its greeting (its read ends at once and
    /// its thread with it), returning its peer's address; `None` if there is none.
    pub(crate) fn evict_oldest(&self) -> Option<String> {
        let (_, stream) = self.open.lock().ok()?.pop_front()?;
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "a peer".into());
        let _ = stream.shutdown(Shutdown::Both);
        Some(peer)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    #[test]
    fn the_oldest_greeting_is_evicted_and_a_finished_one_never() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let served: Vec<TcpStream> = (0..3).map(|_| listener.accept().unwrap().0).collect();
        let greeting = Greeting::default();
        for (conn, stream) in served.iter().enumerate() {
            greeting.enter(conn as ConnId, stream);
        }
        greeting.leave(0);
        assert!(greeting.evict_oldest().is_some());
        // Connection 1 was closed: its client reads the end; connection 0 was not.
        let mut byte = [0u8; 1];
        let mut evicted = &clients[1];
        assert_eq!(evicted.read(&mut byte).unwrap(), 0);
        assert!(greeting.evict_oldest().is_some());
        assert!(greeting.evict_oldest().is_none());
        drop(served);
    }
}
