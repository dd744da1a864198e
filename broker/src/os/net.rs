//! Sockets as the kernel lists them: the IPv4 TCP table (who owns a loopback connection's client
//! end), the Unix sockets a process's network namespace has listening, and the local port range.
//! Linux sources: `/proc/net/tcp`, `/proc/<pid>/net/unix`, `/proc/sys/net/ipv4/ip_local_port_range`.

use std::io;
use std::net::SocketAddrV4;

/// One socket of the kernel's IPv4 TCP table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tcp4Socket {
    /// The uid that created it.
    pub uid: u32,
    /// Its inode (`socket:[inode]` in the fd table of each holder); 0 when no process holds it.
    pub inode: u64,
}

/// The socket whose local address is `local` and remote address `remote` (the 4-tuple names one
/// connection end), if the table lists one.
pub fn tcp4_socket(local: SocketAddrV4, remote: SocketAddrV4) -> io::Result<Option<Tcp4Socket>> {
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    let (local, remote) = (table_addr(local), table_addr(remote));
    let bad = |what: &str, v: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{what} {v:?} in the TCP table"));
    for line in table.lines().skip(1) {
        let t: Vec<&str> = line.split_ascii_whitespace().collect();
        if t.len() > 9 && t[1] == local && t[2] == remote {
            let uid = t[7].parse().map_err(|_| bad("uid", t[7]))?;
            let inode = t[9].parse().map_err(|_| bad("inode", t[9]))?;
            return Ok(Some(Tcp4Socket { uid, inode }));
        }
    }
    Ok(None)
}

/// The inodes of TCP sockets listening on 127.0.0.1:`port` or on every address.
pub fn tcp4_listeners(port: u16) -> io::Result<Vec<u64>> {
    const LISTEN: &str = "0A";
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    let wanted = [format!("0100007F:{port:04X}"), format!("00000000:{port:04X}")];
    Ok(table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|t| t.len() > 9 && t[3] == LISTEN && wanted.iter().any(|w| w == t[1]))
        .filter_map(|t| t[9].parse().ok())
        .collect())
}

/// `127.0.0.1:8080` as the TCP table prints it: the address as a host-order u32, the port big.
fn table_addr(a: SocketAddrV4) -> String {
    format!("{:08X}:{:04X}", u32::from_ne_bytes(a.ip().octets()), a.port())
}

/// `(inode, path)` of the listening, path-bound Unix sockets `pid`'s network namespace has.
pub fn listening_unix_sockets(pid: i32) -> io::Result<Vec<(u64, String)>> {
    Ok(parse_net_unix(&std::fs::read_to_string(format!("/proc/{pid}/net/unix"))?))
}

/// `(inode, path)` of listening, path-bound entries of a `/proc/net/unix` table.
pub fn parse_net_unix(text: &str) -> Vec<(u64, String)> {
    const SO_ACCEPTCON: u32 = 0x10000;
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Num RefCount Protocol Flags Type St Inode [Path]
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            let path = f.get(7)?;
            if flags & SO_ACCEPTCON == 0 || !path.starts_with('/') {
                return None;
            }
            Some((f[6].parse().ok()?, path.to_string()))
        })
        .collect()
}

/// The lowest port the kernel picks for an outgoing connection (`ip_local_port_range`).
pub fn local_port_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_connection_is_found_by_its_four_tuple() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let (std::net::SocketAddr::V4(c), std::net::SocketAddr::V4(s)) = (client.local_addr().unwrap(), server.local_addr().unwrap())
        else {
            panic!("IPv4")
        };
        let sock = tcp4_socket(c, s).unwrap().expect("listed");
        assert_eq!(sock.uid, courier_shared::paths::uid());
        assert!(sock.inode > 0);
        assert_eq!(tcp4_socket(s, c).unwrap().map(|t| t.inode == sock.inode), Some(false), "the other end is another socket");
        assert!(local_port_low().is_some());
    }
}
