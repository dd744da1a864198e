//! The rig of the bridge tests (`bridge*.rs`): a real `nats-server -js`,
//! `courier-bridge serve` per host, network namespaces, the producer's command line, and the
//! least-privilege server configuration.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::broker::{run_bounded, target_bin_dir};
use crate::util::{poll_until, wait_until};
use crate::{Broker, CodexEnv, ExecChild};
use serde_json::{json, Value};

pub const T: Duration = Duration::from_secs(60);

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

pub fn bridge_bin() -> PathBuf {
    let p = target_bin_dir().join("courier-bridge");
    assert!(p.is_file(), "{} not found: `cargo build --workspace` first", p.display());
    p
}

pub fn nats_server_bin() -> PathBuf {
    for p in ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"] {
        if Path::new(p).is_file() {
            return p.into();
        }
    }
    panic!("nats-server not found: `apt-get install -y nats-server` (install/test.sh does it)");
}

/// A `nats-server -js` on a free port with its own store directory; killed on drop.
pub struct Nats {
    pub child: Option<Child>,
    pub addr: String,
    pub port: u16,
    /// The monitoring port (`-m`): `/connz` lists the connected clients.
    pub http_port: u16,
    pub dir: PathBuf,
}

/// A free TCP port on `addr`.
pub fn free_port(addr: &str) -> u16 {
    TcpListener::bind((addr, 0)).unwrap().local_addr().unwrap().port()
}

impl Nats {
    pub fn start(under: &Path) -> Nats {
        Nats::start_with(under, "127.0.0.1", None)
    }

    /// Listening on `addr`, with `conf` (nats-server.conf text: accounts, pings, TLS) if given.
    pub fn start_with(under: &Path, addr: &str, conf: Option<&str>) -> Nats {
        let dir = under.join(format!("nats-{}", crate::util::unique_token()));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(c) = conf {
            std::fs::write(dir.join("server.conf"), c).unwrap();
        }
        let mut n = Nats { child: None, addr: addr.into(), port: free_port(addr), http_port: free_port(addr), dir };
        n.spawn();
        n
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("server.log")).unwrap();
        let mut cmd = Command::new(nats_server_bin());
        let conf = self.dir.join("server.conf");
        if conf.is_file() {
            cmd.arg("-c").arg(conf);
        }
        let child = cmd
            .args(["-js", "-a", &self.addr, "-p", &self.port.to_string(), "-m", &self.http_port.to_string(), "-sd"])
            .arg(self.dir.join("store"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        // Ready when it greets a client with INFO.
        wait_until(Duration::from_secs(20), "nats-server to accept connections", || {
            use std::io::Read;
            let mut s = std::net::TcpStream::connect((self.addr.as_str(), self.port)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).ok()?;
            (&buf == b"INFO").then_some(())
        });
    }

    /// Killed (SIGKILL, as a crash) and started again on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.addr, self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The names of the clients connected now (monitoring `/connz`).
    pub fn client_names(&self) -> Vec<String> {
        use std::io::{Read, Write};
        // The monitoring port listens on the client address too.
        let mut s = std::net::TcpStream::connect((self.addr.as_str(), self.http_port)).expect("nats-server monitoring port");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /connz HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("/connz: {e}: {resp}"));
        v["connections"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str().map(str::to_string)).collect()
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A network namespace joined to the root namespace by a veth pair (`10.A.B.1/30` on the root
/// side, `.2` inside), so a process inside reaches the root namespace only over that link, and
/// [`NetNs::cut`] takes the link down (from inside: the root side keeps its address, so local
/// clients still reach a server listening on it). Names are unique per test process and call;
/// the pair and the namespace are removed on drop, also when the test panics.
pub struct NetNs {
    pub name: String,
    pub root_if: String,
    pub ns_if: String,
    pub root_ip: String,
}

pub fn ip(args: &[&str]) {
    let out = Command::new("/usr/sbin/ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl NetNs {
    pub fn create() -> NetNs {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        assert!(n < 64, "one test process makes at most 64 namespaces");
        // Interface names are at most 15 bytes.
        let name = format!("cr{}x{n}", pid % 100_000);
        let ns = NetNs {
            root_if: format!("{name}r"),
            ns_if: format!("{name}n"),
            root_ip: format!("10.{}.{}.{}", 100 + (pid >> 8) % 100, pid % 256, 4 * n + 1),
            name,
        };
        let ns_ip = format!("10.{}.{}.{}", 100 + (pid >> 8) % 100, pid % 256, 4 * n + 2);
        ip(&["netns", "add", &ns.name]);
        ip(&["link", "add", &ns.root_if, "type", "veth", "peer", "name", &ns.ns_if]);
        ip(&["link", "set", &ns.ns_if, "netns", &ns.name]);
        ip(&["addr", "add", &format!("{}/30", ns.root_ip), "dev", &ns.root_if]);
        ip(&["link", "set", &ns.root_if, "up"]);
        ip(&["netns", "exec", &ns.name, "ip", "addr", "add", &format!("{ns_ip}/30"), "dev", &ns.ns_if]);
        ip(&["netns", "exec", &ns.name, "ip", "link", "set", "lo", "up"]);
        ns.restore();
        ns
    }

    pub fn cut(&self) {
        ip(&["netns", "exec", &self.name, "ip", "link", "set", &self.ns_if, "down"]);
    }

    pub fn restore(&self) {
        ip(&["netns", "exec", &self.name, "ip", "link", "set", &self.ns_if, "up"]);
    }

    /// `program` run inside the namespace (`ip netns exec` execs it: the child is `program`
    /// itself) with `env`'s environment. Its files (unix sockets included) are the root's.
    pub fn command(&self, env: &CodexEnv, program: &Path) -> Command {
        let mut c = env.command("/usr/sbin/ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes both; then the namespace.
        let _ = Command::new("/usr/sbin/ip").args(["link", "del", &self.root_if]).output();
        let _ = Command::new("/usr/sbin/ip").args(["netns", "del", &self.name]).output();
    }
}

/// `courier-bridge serve` for one host; killed on drop.
pub struct Bridge {
    pub child: Child,
    pub log: PathBuf,
}

impl Bridge {
    pub fn start(env: &CodexEnv, url: &str, host: &str, failpoints: Option<&str>) -> Bridge {
        Bridge::start_in(env, None, url, host, failpoints, &[])
    }

    /// In network namespace `ns` when given (its only way to NATS is then `ns`'s veth link),
    /// with `extra` arguments (credentials); returns once it logs `ready:` (its consumer exists).
    pub fn start_in(env: &CodexEnv, ns: Option<&NetNs>, url: &str, host: &str, failpoints: Option<&str>, extra: &[&str]) -> Bridge {
        let mut b = Bridge::spawn(env, ns, url, host, failpoints, extra);
        let ready = poll_until(Duration::from_secs(20), || {
            if let Ok(Some(st)) = b.child.try_wait() {
                panic!("courier-bridge serve exited early ({st}): {}", b.log_text());
            }
            b.log_text().contains("ready:").then_some(())
        });
        assert!(ready.is_some(), "the bridge did not get ready: {}", b.log_text());
        b
    }

    /// As [`Bridge::start_in`], without waiting for it to get ready (a bridge that never may).
    pub fn spawn(env: &CodexEnv, ns: Option<&NetNs>, url: &str, host: &str, failpoints: Option<&str>, extra: &[&str]) -> Bridge {
        let log = env.root.join(format!("bridge-{}.log", crate::util::unique_token()));
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = match ns {
            Some(ns) => ns.command(env, &bridge_bin()),
            None => env.command(bridge_bin()),
        };
        cmd.args(["serve", "--nats", url, "--host", host, "--ack-wait", "2s"]).args(extra).stdout(f.try_clone().unwrap()).stderr(f);
        if let Some(fp) = failpoints {
            cmd.env("COURIER_BRIDGE_FAILPOINTS", fp);
        }
        let child = cmd.spawn().expect("spawn courier-bridge serve");
        Bridge { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Host B: private directories of its own; it runs no Codex, only the producer.
pub fn host_b() -> CodexEnv {
    CodexEnv::with_base_url("http://127.0.0.1:9")
}

/// `courier-bridge <cmd> --nats URL --host hosta <args>` on host B.
pub fn producer(b: &CodexEnv, url: &str, cmd: &str, args: &[&str]) -> Command {
    let mut c = b.command(bridge_bin());
    c.args([cmd, "--nats", url, "--host", "hosta"]);
    if cmd == "send" {
        c.args(["--origin", "hostb"]);
    }
    c.args(args);
    c
}

pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A producer run in the background; joined with its output and the time it exited.
pub struct Bg(std::thread::JoinHandle<(Output, i64)>);

pub fn bg(mut cmd: Command) -> Bg {
    Bg(std::thread::spawn(move || {
        let out = run_bounded(&mut cmd, Duration::from_secs(150));
        (out, now_ms())
    }))
}

impl Bg {
    pub fn join(self) -> (Output, i64) {
        self.0.join().expect("background producer")
    }
}

pub fn spawn_exec(env: &CodexEnv) -> ExecChild {
    env.spawn_exec("please run a command")
}

/// The messages host A's queue holds for `thread`.
pub fn queued(a: &Broker, thread: &str) -> Vec<Value> {
    a.inspect_json()["messages"].as_array().cloned().unwrap_or_default().into_iter().filter(|m| m["thread"] == thread).collect()
}

pub fn consumer_check(b: &CodexEnv, url: &str) -> Value {
    let out = run_bounded(&mut producer(b, url, "check", &[]), Duration::from_secs(30));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("check: {:?}", text(&out)))
}
/// The least-privilege layout of docs/many-hosts.md ("Security and permissions"), as nats-server users
/// with passwords: `admin` (everything: creates the streams and consumers once), the bridges of
/// hosts `hosta` and `hostb`, `producer` (may reach hosta and wait on receipts), `sendonly` (may
/// only publish sends for hosta). Each producer publishes only under its own name
/// (`courier.to.hosta.USER`). Every user has inboxes of its own (`--inbox-prefix`).
/// hosta logs in with the NKey `hosta_nkey` (its public key), the others with passwords.
pub fn least_privilege_conf(hosta_nkey: &str) -> String {
    let bridge = |h: &str| {
        let login = if h == "hosta" { format!("nkey: {hosta_nkey}") } else { format!("user: {h}, password: pw-{h}") };
        format!(
            r#"{{ {login}, permissions: {{
      publish: {{ allow: ["courier.receipt.{h}.*", "$JS.API.STREAM.INFO.*", "$JS.API.CONSUMER.INFO.COURIER_TO_{h}.courier-bridge-{h}",
                          "$JS.API.CONSUMER.MSG.NEXT.COURIER_TO_{h}.courier-bridge-{h}", "$JS.ACK.COURIER_TO_{h}.courier-bridge-{h}.>"] }}
      subscribe: {{ allow: ["courier.threads.{h}", "_INBOX.courier-bridge-{h}.>"] }}
      allow_responses: true }} }}"#
        )
    };
    format!(
        r#"authorization {{ users = [
  {{ user: admin, password: pw-admin }}
  {a}
  {b}
  {{ user: producer, password: pw-producer, permissions: {{
      publish: {{ allow: ["courier.to.hosta.producer", "courier.threads.hosta", "$JS.API.STREAM.INFO.*", "$JS.API.CONSUMER.CREATE.COURIER_RECEIPTS",
                          "$JS.API.CONSUMER.MSG.NEXT.COURIER_RECEIPTS.*", "$JS.API.CONSUMER.DELETE.COURIER_RECEIPTS.*"] }}
      subscribe: {{ allow: ["_INBOX.producer.>"] }} }} }}
  {{ user: sendonly, password: pw-sendonly, permissions: {{
      publish: {{ allow: ["courier.to.hosta.sendonly"] }}
      subscribe: {{ allow: ["_INBOX.sendonly.>"] }} }} }}
] }}
"#,
        a = bridge("hosta"),
        b = bridge("hostb")
    )
}

/// What nats-server answers `user` for each operation (`PUB subject` or `SUB subject`), over the
/// plain client protocol: `None` when allowed, else its `-ERR` (a permissions violation).
pub fn nats_verdicts(nats: &Nats, user: &str, ops: &[&str]) -> Vec<Option<String>> {
    use std::io::{BufRead, BufReader, Write};
    let s = std::net::TcpStream::connect((nats.addr.as_str(), nats.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    // Until PONG, the `-ERR` lines the server sent.
    let mut until_pong = |w: &mut std::net::TcpStream| {
        w.write_all(b"PING\r\n").unwrap();
        let mut errs = Vec::new();
        loop {
            line.clear();
            assert!(r.read_line(&mut line).unwrap() > 0, "nats-server closed the connection ({errs:?})");
            match line.trim_end() {
                "PONG" => return errs,
                l if l.starts_with("-ERR") => errs.push(l.to_string()),
                _ => {}
            }
        }
    };
    let connect = json!({"verbose": false, "pedantic": false, "user": user, "pass": format!("pw-{user}"), "protocol": 1});
    w.write_all(format!("CONNECT {connect}\r\n").as_bytes()).unwrap();
    let errs = until_pong(&mut w);
    assert!(errs.is_empty(), "{user} could not log in: {errs:?}");
    ops.iter()
        .enumerate()
        .map(|(i, op)| {
            let frame = match op.split_once(' ') {
                Some(("PUB", subject)) => format!("PUB {subject} 0\r\n\r\n"),
                Some(("SUB", subject)) => format!("SUB {subject} {}\r\n", i + 1),
                _ => panic!("{op}: PUB or SUB"),
            };
            w.write_all(frame.as_bytes()).unwrap();
            let errs = until_pong(&mut w);
            (!errs.is_empty()).then(|| errs.join(" "))
        })
        .collect()
}

pub fn user_url(nats: &Nats, user: &str) -> String {
    format!("nats://{user}:pw-{user}@{}:{}", nats.addr, nats.port)
}

/// A write lock on a SQLite database (`BEGIN IMMEDIATE` held by a python3 process) until drop:
/// every other writer waits for it (then gets SQLITE_BUSY after its busy timeout).
pub struct WriteLock(Child);

impl WriteLock {
    pub fn hold(db: &Path) -> WriteLock {
        use std::io::BufRead;
        let script = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1],isolation_level=None)\nc.execute('BEGIN IMMEDIATE')\nprint('locked',flush=True)\nsys.stdin.read()\n";
        let mut child =
            Command::new("python3").args(["-c", script]).arg(db).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "locked", "python3 could not lock {}", db.display());
        WriteLock(child)
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// A plain NATS client over the text protocol, logged in as `user` (password `pw-USER`, or no
/// login for `None`), its inboxes under `_INBOX.USER`: what a hostile or old client can publish,
/// and the JetStream API as an operator's tool would call it.
pub struct RawNats {
    w: std::net::TcpStream,
    r: std::io::BufReader<std::net::TcpStream>,
    inbox: String,
    n: u64,
}

/// A reply: its status line (`None` for a plain MSG) and payload.
pub struct RawReply {
    pub status: Option<String>,
    pub payload: Vec<u8>,
}

impl RawReply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.payload).unwrap_or(Value::Null)
    }
}

impl RawNats {
    pub fn connect(nats: &Nats, user: Option<&str>) -> RawNats {
        use std::io::{BufRead, Write};
        let s = std::net::TcpStream::connect((nats.addr.as_str(), nats.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = std::io::BufReader::new(s);
        let mut info = String::new();
        r.read_line(&mut info).unwrap();
        assert!(info.starts_with("INFO"), "{info}");
        let mut connect = json!({"verbose": false, "pedantic": false, "headers": true, "no_responders": true, "protocol": 1});
        if let Some(u) = user {
            connect["user"] = json!(u);
            connect["pass"] = json!(format!("pw-{u}"));
        }
        let inbox = format!("_INBOX.{}", user.unwrap_or("raw"));
        w.write_all(format!("CONNECT {connect}\r\nSUB {inbox}.raw.* 1\r\nPING\r\n").as_bytes()).unwrap();
        let mut c = RawNats { w, r, inbox, n: 0 };
        loop {
            let l = c.line();
            assert!(!l.starts_with("-ERR"), "{user:?} could not log in: {l}");
            if l == "PONG" {
                return c;
            }
        }
    }

    fn line(&mut self) -> String {
        use std::io::{BufRead, Write};
        loop {
            let mut l = String::new();
            assert!(self.r.read_line(&mut l).unwrap() > 0, "nats-server closed the connection");
            let l = l.trim_end().to_string();
            if l == "PING" {
                self.w.write_all(b"PONG\r\n").unwrap();
                continue;
            }
            return l;
        }
    }

    /// Publishes with a reply inbox and waits for the reply (a JetStream ack or API answer).
    /// `Err`: the server's `-ERR` (a permissions violation).
    pub fn request(&mut self, subject: &str, headers: &[(&str, &str)], payload: &[u8]) -> Result<RawReply, String> {
        use std::io::{Read, Write};
        self.n += 1;
        let reply = format!("{}.raw.{}", self.inbox, self.n);
        let mut frame = Vec::new();
        if headers.is_empty() {
            frame.extend(format!("PUB {subject} {reply} {}\r\n", payload.len()).into_bytes());
        } else {
            let mut h = "NATS/1.0\r\n".to_string();
            for (k, v) in headers {
                h.push_str(&format!("{k}: {v}\r\n"));
            }
            h.push_str("\r\n");
            frame.extend(format!("HPUB {subject} {reply} {} {}\r\n{h}", h.len(), h.len() + payload.len()).into_bytes());
        }
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\n");
        self.w.write_all(&frame).unwrap();
        loop {
            let l = self.line();
            if l.starts_with("-ERR") {
                return Err(l);
            }
            let words: Vec<&str> = l.split(' ').collect();
            let (hlen, total) = match words[0] {
                "MSG" => (0, words.last().unwrap().parse::<usize>().unwrap()),
                "HMSG" => (words[words.len() - 2].parse::<usize>().unwrap(), words.last().unwrap().parse::<usize>().unwrap()),
                _ => continue,
            };
            let mut body = vec![0u8; total + 2];
            self.r.read_exact(&mut body).unwrap();
            if words[1] != reply {
                continue;
            }
            let head = String::from_utf8_lossy(&body[..hlen]).to_string();
            let status = head.lines().next().map(|s| s.trim_start_matches("NATS/1.0").trim().to_string()).filter(|s| !s.is_empty());
            return Ok(RawReply { status, payload: body[hlen..total].to_vec() });
        }
    }

    /// Subscribes to `subject` (sid 2).
    pub fn subscribe(&mut self, subject: &str) {
        use std::io::Write;
        self.w.write_all(format!("SUB {subject} 2\r\nPING\r\n").as_bytes()).unwrap();
        while self.line() != "PONG" {}
    }

    /// The payload of the next message on `subject` (subscribed with [`RawNats::subscribe`]).
    pub fn next_on(&mut self, subject: &str) -> Vec<u8> {
        use std::io::Read;
        loop {
            let l = self.line();
            let words: Vec<&str> = l.split(' ').collect();
            if words[0] != "MSG" {
                continue;
            }
            let mut body = vec![0u8; words.last().unwrap().parse::<usize>().unwrap() + 2];
            self.r.read_exact(&mut body).unwrap();
            if words[1] == subject {
                body.truncate(body.len() - 2);
                return body;
            }
        }
    }

    /// A JetStream API call (`$JS.API.` + `api`) with a JSON body; its JSON answer.
    pub fn js(&mut self, api: &str, body: &Value) -> Value {
        let r = self.request(&format!("$JS.API.{api}"), &[], body.to_string().as_bytes()).unwrap_or_else(|e| panic!("{api}: {e}"));
        r.json()
    }
}
