//! The data connection of TCP workers (`strata_proto::bulk`): the real
//! `strata worker` against raw frames from strangers and bad clients, and
//! view bytes through the driver both ways, checked byte for byte against
//! the source, on the data connection and on the gRPC calls it falls back
//! to.

use std::time::{Duration, Instant};

use strata_client::{DataConnection, WorkerClient};
use strata_orchestrator::{Cluster, Task};
use strata_proto::bulk::{
    HEADER_BYTES, HELLO_BYTES, Hello, RefusalCode, Reply, Request, SECRET_BYTES,
};
use strata_tests::{WorkerProcess, strata_bin};
use strata_wire::DType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A token-authenticated TCP worker; `extra` arguments after the token.
fn tcp_worker(dir: &tempfile::TempDir, extra: &[&str]) -> WorkerProcess {
    let token = dir.path().join("token");
    std::fs::write(&token, "bulk").unwrap();
    let mut args = vec!["--token-file", token.to_str().unwrap()];
    args.extend_from_slice(extra);
    WorkerProcess::spawn_tcp(&strata_bin(), &["worker"], &args)
}

/// What the worker sent back: its reply header and any reason after it,
/// then whether it closed the connection.
async fn answer(s: &mut TcpStream) -> (Reply, String) {
    let mut h = [0u8; HEADER_BYTES];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut h))
        .await
        .expect("an answer within 10 s")
        .expect("a reply header");
    let reply = Reply::decode(&h).expect("a well-formed reply");
    let mut reason = String::new();
    if let Reply::Refused { len, .. } = reply {
        let mut r = vec![0u8; len as usize];
        s.read_exact(&mut r).await.unwrap();
        reason = String::from_utf8(r).unwrap();
    }
    (reply, reason)
}

async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

fn refused(reply: Reply) -> RefusalCode {
    match reply {
        Reply::Refused { code, .. } => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Strangers, bad secrets, garbage, oversize and truncated frames: each is
/// refused with why and its connection closed, a refused request in a
/// good connection leaves it in step, a truncated stage gives its id and
/// bytes back, and the worker goes on serving every session.
#[tokio::test(flavor = "multi_thread")]
async fn the_data_port_refuses_strangers_and_bad_frames_and_the_worker_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let w = tcp_worker(&dir, &[]);
    let mut client = WorkerClient::connect(&w.endpoint, Some("bulk"))
        .await
        .unwrap();
    let hs = client.handshake().await.unwrap();
    let offer = hs
        .data
        .clone()
        .expect("a token-authenticated worker offers a data port");
    let strata_client::Endpoint::Tcp(addr) = w.endpoint else {
        unreachable!()
    };
    let at = std::net::SocketAddr::new(addr.ip(), offer.port);
    let connect = || async move {
        let s = TcpStream::connect(at).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    };
    let hello = |session: u64, secret: [u8; SECRET_BYTES]| {
        Hello {
            session,
            hold_from: 0,
            secret,
        }
        .encode()
    };

    // A wrong secret, and a session that does not exist: the same refusal.
    for (session, secret) in [
        (hs.session.0, [0u8; SECRET_BYTES]),
        (hs.session.0 ^ 2, offer.secret.0),
    ] {
        let mut s = connect().await;
        s.write_all(&hello(session, secret)).await.unwrap();
        let (r, why) = answer(&mut s).await;
        assert_eq!(refused(r), RefusalCode::Unauthenticated, "{why}");
        assert!(
            why.contains("unknown or has ended, or the secret is wrong"),
            "{why}"
        );
        assert!(closed(&mut s).await);
    }
    // The same through the client.
    let mut wrong = offer.clone();
    wrong.secret.0[0] ^= 1;
    let e = DataConnection::connect(at, hs.session, &wrong, 0)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("secret is wrong"), "{e}");

    // Garbage where a hello belongs.
    let mut s = connect().await;
    let mut junk = [b'x'; HELLO_BYTES];
    junk[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
    s.write_all(&junk).await.unwrap();
    let (r, why) = answer(&mut s).await;
    assert_eq!(refused(r), RefusalCode::Invalid);
    assert!(why.contains("hello.magic"), "{why}");
    assert!(closed(&mut s).await);

    // An authenticated connection: an oversize stage header ends it
    // before anything is allocated.
    let mut s = connect().await;
    s.write_all(&hello(hs.session.0, offer.secret.0))
        .await
        .unwrap();
    assert!(matches!(answer(&mut s).await.0, Reply::Ok { .. }));
    let mut over = Request::Stage { id: 1, len: 1 }.encode();
    over[16..24].copy_from_slice(&(strata_proto::MAX_INLINE_EXTENT + 1).to_le_bytes());
    s.write_all(&over).await.unwrap();
    let (r, why) = answer(&mut s).await;
    assert_eq!(refused(r), RefusalCode::Invalid);
    assert!(why.contains("stage.len"), "{why}");
    assert!(closed(&mut s).await);

    // A truncated stage: the connection closes midway; its id (and the
    // bytes it announced) are given back, so the same id stages again.
    let mut s = connect().await;
    s.write_all(&hello(hs.session.0, offer.secret.0))
        .await
        .unwrap();
    assert!(matches!(answer(&mut s).await.0, Reply::Ok { .. }));
    s.write_all(
        &Request::Stage {
            id: 5,
            len: 1 << 20,
        }
        .encode(),
    )
    .await
    .unwrap();
    s.write_all(&[7u8; 1000]).await.unwrap();
    drop(s);

    // A good connection: refusals keep it in step.
    let mut good = DataConnection::connect(at, hs.session, &offer, 0)
        .await
        .unwrap();
    let body = vec![3u8; 4096];
    let t0 = Instant::now();
    loop {
        // The worker notices the truncated connection's end a moment after
        // it was dropped.
        match good.stage(5, strata_client::Body::Bytes(&body)).await {
            Ok(()) => break,
            Err(e) if t0.elapsed() < Duration::from_secs(5) => {
                assert!(e.to_string().contains("in use"), "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the truncated stage never gave its id back: {e}"),
        }
    }
    let e = good
        .stage(5, strata_client::Body::Bytes(&body))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("stage id 5 is in use"), "{e}");
    let mut into = Vec::new();
    let e = good.fetch(99, 4096, &mut into).await.unwrap_err();
    assert!(e.to_string().contains("no held bytes 99"), "{e}");
    let file = tempfile::tempfile().unwrap();
    let e = good
        .fetch_to_file(98, std::os::fd::AsFd::as_fd(&file), 0, 4096)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no held bytes 98"), "{e}");
    assert_eq!(file.metadata().unwrap().len(), 0, "nothing landed");
    good.stage(6, strata_client::Body::Bytes(&body))
        .await
        .expect("still in step after three refusals");

    // At most four data connections per session.
    let mut more = Vec::new();
    for _ in 0..3 {
        more.push(
            DataConnection::connect(at, hs.session, &offer, 0)
                .await
                .unwrap(),
        );
    }
    let e = DataConnection::connect(at, hs.session, &offer, 0)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("data connections already"), "{e}");
    drop(more);

    // A connection that never says hello is closed after the timeout.
    let mut idle = connect().await;
    let t0 = Instant::now();
    let (r, why) = answer(&mut idle).await;
    assert_eq!(refused(r), RefusalCode::Invalid);
    assert!(why.contains("no hello within"), "{why}");
    assert!(closed(&mut idle).await);
    assert!(t0.elapsed() >= Duration::from_secs(4), "{:?}", t0.elapsed());

    // The worker serves on: this session (a fresh data connection) and a
    // new one.
    let mut again = DataConnection::connect(at, hs.session, &offer, 0)
        .await
        .unwrap();
    again
        .stage(7, strata_client::Body::Bytes(&body))
        .await
        .unwrap();
    let mut other = WorkerClient::connect(&w.endpoint, Some("bulk"))
        .await
        .unwrap();
    let hs2 = other.handshake().await.unwrap();
    assert_ne!(
        hs2.data.as_ref().unwrap().secret,
        offer.secret,
        "per session"
    );
    assert_eq!(
        other.ping(b"still here".to_vec()).await.unwrap(),
        b"still here"
    );
    // One session's secret opens no other session.
    let e = DataConnection::connect(at, hs2.session, &offer, 0)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("secret is wrong"), "{e}");
}

/// A buffer of `n` u32 whose element i is `f(i)`.
fn filled(cluster: &Cluster, n: u32, f: impl Fn(u32) -> u32) -> strata_orchestrator::Buffer {
    let values: Vec<u32> = (0..n).map(f).collect();
    cluster.buffer_from_slice(&values).unwrap()
}

/// Copies views of several sizes and strides to the worker and back
/// through `cluster` (one TCP worker) and checks every element of the
/// destination buffer against the source; returns the bytes that went
/// each way. `larger_than_a_message` adds an 80 MiB view.
fn round_trips(cluster: &Cluster, larger_than_a_message: bool) -> (u64, u64) {
    let mut sent = 0u64;
    // (elements, source offset and stride, destination offset and stride)
    let cases: [(u32, u32, u32, u32, u32); 6] = [
        (1024, 0, 1, 0, 1),          // 4 KiB: in the task's message
        ((1 << 16) - 1, 1, 1, 2, 1), // just under 256 KiB: in the message
        (1 << 18, 3, 1, 5, 1),       // 1 MiB at an offset: by sendfile
        (3 << 18, 1, 2, 0, 2),       // 3 MiB every other element: packed
        (4 << 20, 0, 1, 7, 1),       // 16 MiB
        (20 << 20, 2, 1, 1, 1),      // 80 MiB: more than a message
    ];
    let cases = if larger_than_a_message {
        &cases[..]
    } else {
        &cases[..5]
    };
    for &(n, so, ss, d_off, ds) in cases {
        let src_len = so + (n - 1) * ss + 1;
        let dst_len = d_off + (n - 1) * ds + 1 + 3;
        let mix = |i: u32| i.wrapping_mul(2_654_435_761) ^ n;
        let src_buf = filled(cluster, src_len, mix);
        let dst_buf = filled(cluster, dst_len, |i| !i);
        let src = src_buf
            .view(u64::from(so) * 4, &[n], &[ss], DType::U32)
            .unwrap();
        let dst = dst_buf
            .view(u64::from(d_off) * 4, &[n], &[ds], DType::U32)
            .unwrap();
        let t = cluster
            .submit(Task::new("copy").input(&src).output(&dst))
            .unwrap();
        cluster
            .wait(t)
            .unwrap_or_else(|e| panic!("{n} elements: {e}"));
        sent += u64::from(n) * 4;
        let got = dst_buf
            .tensor(&[dst_len], DType::U32)
            .unwrap()
            .read::<u32>()
            .unwrap();
        for (i, &g) in got.iter().enumerate() {
            let i = i as u32;
            let want = if i >= d_off && (i - d_off) % ds == 0 && (i - d_off) / ds < n {
                mix(so + (i - d_off) / ds * ss)
            } else {
                !i
            };
            assert!(
                g == want,
                "{n} elements: element {i} is {g:#x}, not {want:#x}"
            );
        }
    }
    // A view the task reads and writes (INOUT), 4 MiB at an offset: both
    // ways on the data connection, its bytes fetched whole before they
    // land.
    let n = 1u32 << 20;
    let xs: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let ys: Vec<f32> = (0..n + 5).map(|i| (2 * (i % 777)) as f32).collect();
    let x_buf = cluster.buffer_from_slice(&xs).unwrap();
    let y_buf = cluster.buffer_from_slice(&ys).unwrap();
    let x = x_buf.tensor(&[n], DType::F32).unwrap();
    let y = y_buf.view(3 * 4, &[n], &[1], DType::F32).unwrap();
    let t = cluster
        .submit(Task::new("axpy").input(&x).inout(&y).scalar_f64(3.0))
        .unwrap();
    cluster.wait(t).unwrap();
    let got = y_buf
        .tensor(&[n + 5], DType::F32)
        .unwrap()
        .read::<f32>()
        .unwrap();
    for (i, &g) in got.iter().enumerate() {
        let want = if (3..3 + n as usize).contains(&i) {
            3.0 * xs[i - 3] + ys[i]
        } else {
            ys[i]
        };
        assert!(
            g.to_bits() == want.to_bits(),
            "axpy: element {i} is {g}, not {want}"
        );
    }
    let back = sent + u64::from(n) * 4;
    sent += 2 * u64::from(n) * 4;
    (sent, back)
}

/// Views of every size, contiguous and strided, at offsets, up to one
/// larger than a message, go to a token-authenticated TCP worker and come
/// back byte for byte on its data connection, with the bytes counted once
/// each way.
#[test]
fn views_round_trip_byte_for_byte_on_the_data_connection() {
    let dir = tempfile::tempdir().unwrap();
    let w = tcp_worker(&dir, &[]);
    let cluster = Cluster::builder()
        .connect(&w.endpoint.to_string(), Some("bulk"))
        .unwrap()
        .start()
        .unwrap();
    assert!(cluster.workers()[0].data_connection);
    let (sent, back) = round_trips(&cluster, true);
    let t = cluster.totals().unwrap();
    assert_eq!((t.sent_bytes, t.returned_bytes), (sent, back), "{t:?}");
    // A view past what may be staged at all fails its task alone, as the
    // `Stage` call would refuse it; the connection stays usable.
    let huge = (strata_proto::MAX_INLINE_EXTENT / 4 + 1) as u32;
    let from = cluster.buffer(u64::from(huge) * 4).unwrap();
    let to = cluster.buffer(u64::from(huge) * 4).unwrap();
    let task = cluster
        .submit(
            Task::new("copy")
                .input(&from.tensor(&[huge], DType::U32).unwrap())
                .output(&to.tensor(&[huge], DType::U32).unwrap()),
        )
        .unwrap();
    let e = cluster.wait(task).unwrap_err();
    assert!(
        matches!(&e, strata_orchestrator::Error::Run(r)
            if r.outcome.kind() == Some(strata_orchestrator::FailureKind::Refused)),
        "{e}"
    );
    let e = e.to_string();
    assert!(
        e.contains("TASK_FAILURE") && e.contains("the largest inline view"),
        "{e}"
    );
    let again = round_trips(&cluster, false);
    assert!(again.0 < sent);
    assert!(cluster.is_up(cluster.workers()[0].id));
}

/// A worker started with `--no-data-port`, and a cluster built with
/// `data_connection(false)`, stage and fetch on the gRPC calls: the same
/// bytes, the same counts.
#[test]
fn without_a_data_connection_views_travel_on_grpc_calls() {
    let dir = tempfile::tempdir().unwrap();
    let off = tcp_worker(&dir, &["--no-data-port"]);
    let on = tcp_worker(&dir, &[]);
    for (w, use_it) in [(&off, true), (&on, false)] {
        let cluster = Cluster::builder()
            .data_connection(use_it)
            .connect(&w.endpoint.to_string(), Some("bulk"))
            .unwrap()
            .start()
            .unwrap();
        assert!(!cluster.workers()[0].data_connection);
        // The 80 MiB view on `Stage` and `Fetch` is the bench's, and
        // `views_larger_than_a_message_travel_in_chunks`'s.
        let (sent, back) = round_trips(&cluster, false);
        let t = cluster.totals().unwrap();
        assert_eq!((t.sent_bytes, t.returned_bytes), (sent, back), "{t:?}");
    }
}
