//! The bridge's security on a real `nats-server -js` and the real Codex: least privilege (the
//! accounts of docs/many-hosts.md on a server that enforces them, with negative tries) and TLS
//! with a private CA. The rig is the kit's `courier_tests::bridge`.

use std::path::{Path, PathBuf};
use std::process::Command;

use courier_tests::bridge::*;
use courier_tests::broker::run_bounded;
use courier_tests::util::{marker, wait_until};
use courier_tests::{Broker, CodexEnv};

/// Least privilege, on a server that enforces the layout of docs/many-hosts.md: host A's bridge with only
/// its own rights (logged in with an NKey `courier-bridge nkey` made) delivers a producer's message to A's real Codex session once, confirmed
/// (thread list too); host B's credentials cannot consume A's sends, forge A's receipts, answer
/// A's thread requests or read anyone's inboxes (tried with the protocol and by running a
/// bridge for A with B's credentials: nothing reaches A until A's own bridge runs); a producer
/// allowed only to publish sends for A can send, but cannot wait on, subscribe to or open a
/// consumer on receipts, nor ask for A's threads.
#[test]
fn least_privilege_accounts_hold() {
    let (model, env_a, hold) = CodexEnv::with_held_turn();
    let env_b = host_b();
    let env_c = host_b();
    // hosta's NKey, made by `courier-bridge nkey` (the seed stays in A's file).
    let seed = env_a.root.join("hosta.nk");
    let out = run_bounded(env_a.command(bridge_bin()).arg("nkey").arg(&seed), T);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let public = text(&out).0.trim().to_string();
    assert!(public.starts_with('U') && std::fs::read_to_string(&seed).unwrap().starts_with("SU"), "{public}");
    let again = run_bounded(env_a.command(bridge_bin()).arg("nkey").arg(&seed), T);
    assert_eq!(again.status.code(), Some(1), "an existing seed is never overwritten: {:?}", text(&again));
    let nkey = ["--nkey", seed.to_str().unwrap()];
    let nats = Nats::start_with(&env_b.root, "127.0.0.1", Some(&least_privilege_conf(&public)));
    let a = Broker::start_trusted(&env_a);
    // The operator's first run creates the streams and both hosts' consumers.
    drop(Bridge::start(&env_a, &user_url(&nats, "admin"), "hosta", None));
    drop(Bridge::start(&env_c, &user_url(&nats, "admin"), "hostb", None));

    // The protocol: each user may do exactly its part.
    let denied = |user: &str, ops: &[&str], want: &[bool]| {
        let got = nats_verdicts(&nats, user, ops);
        for ((op, v), w) in ops.iter().zip(&got).zip(want) {
            assert_eq!(v.is_some(), *w, "{user}: {op}: {v:?}");
            if let Some(e) = v {
                assert!(e.contains("Permissions Violation"), "{user}: {op}: {e}");
            }
        }
    };
    denied(
        "hostb",
        &[
            "PUB courier.receipt.hostb.producer",
            "SUB courier.threads.hostb",
            "PUB $JS.API.CONSUMER.MSG.NEXT.COURIER_TO_hostb.courier-bridge-hostb",
            "PUB $JS.API.CONSUMER.MSG.NEXT.COURIER_TO_hosta.courier-bridge-hosta",
            "PUB $JS.ACK.COURIER_TO_hosta.courier-bridge-hosta.1.1.1.1.0",
            "PUB courier.receipt.hosta.producer",
            "SUB courier.threads.hosta",
            "SUB courier.to.hosta.*",
            "SUB courier.to.>",
            "SUB _INBOX.>",
            "SUB _INBOX.courier-bridge-hosta.>",
            "PUB $JS.API.CONSUMER.CREATE.COURIER_TO_hosta",
            "PUB courier.to.hosta.hostb",
        ],
        &[false, false, false, true, true, true, true, true, true, true, true, true, true],
    );
    denied(
        "sendonly",
        &[
            "PUB courier.to.hosta.sendonly",
            "PUB courier.to.hosta.producer",
            "PUB courier.to.hostb.sendonly",
            "SUB courier.receipt.hosta.sendonly",
            "SUB courier.receipt.>",
            "PUB $JS.API.CONSUMER.CREATE.COURIER_RECEIPTS",
            "PUB $JS.API.STREAM.INFO.COURIER_RECEIPTS",
            "PUB courier.threads.hosta",
            "SUB _INBOX.>",
            "SUB _INBOX.producer.>",
        ],
        &[false, true, true, true, true, true, true, true, true, true],
    );
    denied(
        "producer",
        &[
            "PUB courier.to.hosta.producer",
            "PUB courier.to.hostb.producer",
            "PUB courier.to.hosta.sendonly",
            "PUB courier.receipt.hosta.producer",
            "PUB $JS.API.CONSUMER.MSG.NEXT.COURIER_TO_hosta.courier-bridge-hosta",
            "SUB _INBOX.>",
        ],
        &[false, true, true, true, true, true],
    );

    let child = spawn_exec(&env_a);
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let as_user = |user: &str, cmd: &str, args: &[&str]| {
        let mut c = producer(&env_b, &user_url(&nats, user), cmd, args);
        c.args(["--inbox-prefix", &format!("_INBOX.{user}")]);
        if cmd == "send" {
            c.args(["--origin", user]);
        }
        c
    };

    // A bridge for hosta run with hostb's credentials: it never gets A's sends.
    let early = marker("EARLY");
    let out = run_bounded(&mut as_user("sendonly", "send", &["--thread", &thread, "--from", "ci", &early]), T);
    assert_eq!(out.status.code(), Some(0), "a publish-only producer can send: {:?}", text(&out));
    // (Its own inboxes: with the default, _INBOX.courier-bridge-hosta, it cannot even look.)
    let impostor =
        Bridge::spawn(&env_c, None, &user_url(&nats, "hostb"), "hosta", None, &["--inbox-prefix", "_INBOX.courier-bridge-hostb"]);
    wait_until(T, "the impostor bridge to be refused", || impostor.log_text().contains("Permissions Violation").then_some(()));
    let c = consumer_check(&env_b, &user_url(&nats, "admin"));
    // The early send and the two empty probes the allowed `PUB courier.to.hosta.USER` above left
    // (A's bridge refuses those: not JSON) all still wait for A.
    assert_eq!((c["pending"].as_u64(), c["ack_pending"].as_u64()), (Some(3), Some(0)), "the sends still wait for A: {c}");
    assert!(Broker::cli_only(&env_c).inspect_json()["messages"].as_array().unwrap().is_empty(), "nothing queued by the impostor");
    drop(impostor);
    let out = run_bounded(&mut producer(&env_b, &user_url(&nats, "hostb"), "check", &[]), T);
    assert_eq!(out.status.code(), Some(1), "hostb cannot look at A's consumer: {:?}", text(&out));

    // A's own bridge, with only A's rights: the early send, a producer's send with --wait, threads.
    let bridge = Bridge::start_in(&env_a, None, &nats.url(), "hosta", None, &nkey);
    // ... and `broker doctor`'s check, with A's rights too.
    let out = run_bounded(&mut producer(&env_a, &nats.url(), "check", &nkey), T);
    assert_eq!(out.status.code(), Some(0), "A may look at its own consumer: {:?}", text(&out));
    wait_until(T, "the early send queued on A", || queued(&a, &thread).into_iter().next());
    let out = run_bounded(&mut as_user("producer", "threads", &["--json"]), T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "threads: {stdout} {stderr}\nbridge: {}", bridge.log_text());
    assert!(stdout.contains(&thread), "{stdout}");
    let body = marker("PRIV");
    let send = bg(as_user("producer", "send", &["--thread", &thread, "--from", "relay", "--wait", "confirmed", "--timeout", "90s", &body]));
    wait_until(T, "the producer's message queued on A", || (queued(&a, &thread).len() == 2).then_some(()));

    // The publish-only producer cannot wait (and publishes nothing then); its threads request
    // was refused above (`PUB courier.threads.hosta`).
    let nowait = marker("NOWAIT");
    let out = run_bounded(&mut as_user("sendonly", "send", &["--thread", &thread, "--wait", "confirmed", "--timeout", "10s", &nowait]), T);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout} {stderr}");
    assert!(stderr.contains("$JS.API.STREAM.INFO.COURIER_RECEIPTS"), "{stderr}");

    hold.release();
    child.wait(T).assert_success();
    let (out, _) = send.join();
    assert_eq!(out.status.code(), Some(0), "{:?}\nbridge: {}", text(&out), bridge.log_text());
    for b in [&early, &body] {
        assert_eq!(model.count_messages_containing("developer", b), 1, "{}", model.dump());
    }
    assert_eq!(model.count_messages_containing("developer", &nowait), 0);
    let q = queued(&a, &thread);
    assert_eq!(q.len(), 2, "{q:?}");
    assert!(!bridge.log_text().contains("Permissions Violation"), "A's bridge needed no more rights: {}", bridge.log_text());
}

/// A CA and a server certificate for 127.0.0.1 signed by it, made with openssl in `dir`:
/// (ca.pem, server.pem, server.key).
fn make_tls(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl (apt-get install openssl)");
        assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=courier test CA",
    ]);
    run(&["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

/// TLS with a private CA (a certificate the test makes): the bridge and a producer given
/// `--tls-ca` connect over `tls://` and the message is queued on A; a producer that does not
/// trust the CA fails (1) and publishes nothing, with `tls://` or `nats://` alike.
#[test]
fn tls_with_a_private_ca() {
    let env_a = host_b();
    let env_b = host_b();
    let (ca, cert, key) = make_tls(&env_b.root.join("tls"));
    let conf = format!("tls {{ cert_file: \"{}\", key_file: \"{}\", timeout: 5 }}\n", cert.display(), key.display());
    let nats = Nats::start_with(&env_b.root, "127.0.0.1", Some(&conf));
    let tls_url = format!("tls://127.0.0.1:{}", nats.port);
    let a = Broker::start(&env_a);
    let ca_arg = ca.to_str().unwrap();
    let bridge = Bridge::start_in(&env_a, None, &tls_url, "hosta", None, &["--tls-ca", ca_arg]);
    let thread = "01a22654-3b31-76f3-a48c-b65aa7d0db71";
    let body = marker("TLS");
    let out = run_bounded(&mut producer(&env_b, &tls_url, "send", &["--thread", thread, "--future-thread", "--tls-ca", ca_arg, &body]), T);
    assert_eq!(out.status.code(), Some(0), "{:?}\nbridge: {}", text(&out), bridge.log_text());
    wait_until(T, "the message queued on A over TLS", || queued(&a, thread).into_iter().find(|m| m["origin"] == "nats:hostb"));

    // Without the CA: refused, also for a nats:// URL (the server requires TLS, so the client
    // upgrades, and verifies the server as for tls://).
    for url in [tls_url.as_str(), nats.url().as_str()] {
        let out = run_bounded(&mut producer(&env_b, url, "send", &["--thread", thread, "--future-thread", &marker("NOTLS")]), T);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{url}: {stdout} {stderr}");
        assert!(stdout.is_empty() && stderr.contains("connecting to NATS"), "{url}: {stderr}");
    }
    assert_eq!(queued(&a, thread).len(), 1, "only the trusted send arrived");
}
