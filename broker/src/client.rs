//! Talking to a running broker from the CLI (`inspect`, `install`, `doctor`): a client of its
//! socket, never part of the daemon.

use courier_shared::wire::{self, Request, StatusReply, PROTOCOL_VERSION};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Asks a running broker for its status; `None` when none answers.
pub fn query_status(runtime_dir: &Path) -> Option<StatusReply> {
    let mut stream = UnixStream::connect(courier_shared::paths::socket_path(runtime_dir)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    wire::write_json(&mut stream, &Request::Status { v: PROTOCOL_VERSION }).ok()?;
    wire::read_json(&mut stream, wire::MAX_FRAME).ok()
}
