//! The plain HTTP/1.1 side of the scripted APIs: the accept loop (a thread per keep-alive
//! connection), the request reader (content-length or chunked bodies) and the response writer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One HTTP request as read off the wire (header names lowercased).
pub struct RawRequest {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The path without its query string or a trailing slash.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or("").trim_end_matches('/')
    }
}

/// A loopback server's accept loop: it serves every connection on its own thread, each request
/// read off a keep-alive connection going to the handler with the writing half (an `Err` closes
/// the connection). Dropping it stops accepting.
pub struct AcceptLoop {
    stop: Arc<AtomicBool>,
    pub addr: SocketAddr,
}

impl AcceptLoop {
    /// Bind `127.0.0.1:0` and serve it with `handle`.
    pub fn start(name: &str, handle: impl Fn(&mut TcpStream, RawRequest) -> std::io::Result<()> + Send + Sync + 'static) -> AcceptLoop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, handle, conn_name) = (stop.clone(), Arc::new(handle), format!("{name}-conn"));
        std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (stop, handle) = (stop2.clone(), handle.clone());
                    let _ = std::thread::Builder::new().name(conn_name.clone()).spawn(move || serve(conn, &stop, &*handle));
                }
            })
            .expect("spawn accept thread");
        AcceptLoop { stop, addr }
    }
}

impl Drop for AcceptLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn serve(conn: TcpStream, stop: &AtomicBool, handle: &dyn Fn(&mut TcpStream, RawRequest) -> std::io::Result<()>) {
    let _ = conn.set_nodelay(true);
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    while let Ok(Some(req)) = read_request(&mut r) {
        if stop.load(Ordering::SeqCst) || handle(&mut w, req).is_err() {
            return;
        }
    }
}

fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<RawRequest>> {
    let mut line = String::new();
    // Skip stray empty lines between keep-alive requests.
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
            if n == 0 {
                // Trailers until the empty line.
                loop {
                    let mut t = String::new();
                    if r.read_line(&mut t)? == 0 || t.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            let mut chunk = vec![0; n];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body = vec![0; n];
        r.read_exact(&mut body)?;
    }
    Ok(Some(RawRequest { method, path, headers, body }))
}

pub fn write_response(w: &mut TcpStream, status: u16, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let head =
        format!("HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\ncache-control: no-cache\r\n\r\n", body.len());
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}
