//! The ring against a queue oracle, a hostile peer, and (under loom)
//! every interleaving of the protocol.

// The loom byte store needs `unsafe` to reach its cells.
#![cfg_attr(loom, allow(unsafe_code))]

use std::sync::Arc;

use crate::{Consumer, Lane, Memory, Producer, RingError, Spin, Store, Waited, Which};

/// Both lanes on the heap: what the models and the unit tests share.
struct Heap {
    lanes: [Lane; 2],
    bytes: [Bytes; 2],
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Heap")
    }
}

impl Heap {
    fn new(cap: usize) -> Arc<Heap> {
        Arc::new(Heap {
            lanes: [Lane::default(), Lane::default()],
            bytes: [Bytes::new(cap), Bytes::new(cap)],
        })
    }
}

fn ix(which: Which) -> usize {
    match which {
        Which::Submit => 0,
        Which::Complete => 1,
    }
}

impl Memory for Heap {
    fn lane(&self, which: Which) -> &Lane {
        &self.lanes[ix(which)]
    }
    fn store(&self, which: Which) -> &dyn Store {
        &self.bytes[ix(which)]
    }
}

/// Bytes loom tracks: a read not ordered after the write it sees is a
/// reported race, which is what "a record is read only after it is fully
/// written" means.
#[cfg(loom)]
struct Bytes(Vec<loom::cell::UnsafeCell<u8>>);
#[cfg(loom)]
// SAFETY: test memory; loom checks every access's ordering.
unsafe impl Sync for Bytes {}
#[cfg(loom)]
impl Bytes {
    fn new(cap: usize) -> Self {
        Bytes((0..cap).map(|_| loom::cell::UnsafeCell::new(0)).collect())
    }
}
#[cfg(loom)]
impl Store for Bytes {
    fn capacity(&self) -> usize {
        self.0.len()
    }
    fn put(&self, at: usize, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            // SAFETY: loom's cell; the model checks the access.
            self.0[at + i].with_mut(|p| unsafe { *p = *b });
        }
    }
    fn get(&self, at: usize, dst: &mut [u8]) {
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: as above.
            *d = self.0[at + i].with(|p| unsafe { *p });
        }
    }
}

#[cfg(not(loom))]
struct Bytes(Vec<std::sync::atomic::AtomicU8>);
#[cfg(not(loom))]
impl Bytes {
    fn new(cap: usize) -> Self {
        Bytes(
            (0..cap)
                .map(|_| std::sync::atomic::AtomicU8::new(0))
                .collect(),
        )
    }
}
#[cfg(not(loom))]
impl Store for Bytes {
    fn capacity(&self) -> usize {
        self.0.len()
    }
    fn put(&self, at: usize, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            self.0[at + i].store(*b, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn get(&self, at: usize, dst: &mut [u8]) {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = self.0[at + i].load(std::sync::atomic::Ordering::Relaxed);
        }
    }
}

fn record(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

#[cfg(loom)]
/// Reads `n` records, waiting (parked, no spinning) between them.
fn read_all(c: &mut Consumer, n: usize, spin: Spin) -> Result<Vec<Vec<u8>>, RingError> {
    let mut got = Vec::new();
    let mut buf = Vec::new();
    while got.len() < n {
        if c.try_pop(&mut buf)? {
            got.push(buf.clone());
            continue;
        }
        match c.wait(spin, None) {
            Waited::Ready => {}
            Waited::Closed => return Err(RingError::Closed),
            Waited::TimedOut => unreachable!("no deadline"),
        }
    }
    c.release();
    Ok(got)
}

#[cfg(loom)]
mod loom_models {
    use super::*;
    use loom::thread;

    fn ends(cap: usize) -> (Producer, Consumer, Arc<Heap>) {
        let heap = Heap::new(cap);
        let mem: Arc<dyn Memory> = heap.clone();
        (
            Producer::new(Arc::clone(&mem), Which::Submit),
            Consumer::new(mem, Which::Submit),
            heap,
        )
    }

    /// A record is read only after it is fully written (loom reports a
    /// read of a byte not ordered after its write), and a consumer that
    /// parks as the producer publishes is woken (a lost wake-up is a
    /// deadlock loom reports).
    #[test]
    fn publish_consume_no_lost_wakeup() {
        loom::model(|| {
            let (mut p, mut c, _heap) = ends(64);
            let reader = thread::spawn(move || read_all(&mut c, 2, Spin::NONE).unwrap());
            assert!(p.try_push(&record(0, 5)).unwrap());
            p.publish();
            assert!(p.try_push(&record(1, 3)).unwrap());
            p.publish();
            assert_eq!(reader.join().unwrap(), vec![record(0, 5), record(1, 3)]);
        });
    }

    /// Records that do not fit before the region's end wrap after a pad,
    /// and a full ring makes the producer wait (parked) for room: every
    /// record arrives once, in order.
    #[test]
    fn wrap_around_and_full_ring_backpressure() {
        loom::model(|| {
            // 64 bytes: a 20-byte record takes 32, so two fill the ring
            // and the third waits; 12-byte ones (24) leave pads.
            let (mut p, mut c, _heap) = ends(64);
            let sizes = [20usize, 12, 20];
            let reader = thread::spawn(move || read_all(&mut c, 3, Spin::NONE).unwrap());
            for (i, &n) in sizes.iter().enumerate() {
                assert!(p.push(&record(i, n), Spin::NONE, None).unwrap());
                p.publish();
            }
            let want: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| record(i, n))
                .collect();
            assert_eq!(reader.join().unwrap(), want);
        });
    }

    /// Closing wakes a consumer parked on an empty ring and a producer
    /// parked on a full one.
    #[test]
    fn shutdown_while_parked() {
        loom::model(|| {
            let (mut p, mut c, heap) = ends(64);
            let reader = thread::spawn(move || c.wait(Spin::NONE, None));
            assert!(p.try_push(&record(0, 20)).unwrap());
            assert!(p.try_push(&record(1, 20)).unwrap());
            let closer = {
                let heap = Arc::clone(&heap);
                thread::spawn(move || crate::close(&*heap))
            };
            // The ring is full and nobody reads: only the close ends this.
            let pushed = p.push(&record(2, 20), Spin::NONE, None);
            closer.join().unwrap();
            assert_eq!(pushed, Err(RingError::Closed));
            // The reader either saw the records (published before the
            // producer parked) or the close.
            let w = reader.join().unwrap();
            assert!(matches!(w, Waited::Ready | Waited::Closed), "{w:?}");
        });
    }
    /// A lane handed between a thread and a poller (`watched`): the
    /// poller takes it, looks once and hands it back while the producer
    /// publishes two records; both are handed on, once each and in order
    /// (the main thread waits for them: a hand-off that loses one is a
    /// deadlock loom reports), and closing the ring ends the thread
    /// wherever it waits.
    #[test]
    fn a_lane_handed_between_thread_and_poller_loses_no_record() {
        use crate::watched::Watched;
        use loom::sync::{Condvar, Mutex};
        loom::model(|| {
            let (mut p, c, heap) = ends(64);
            let lane = Arc::new(Watched::new(c, Vec::new()));
            let got = Arc::new((Mutex::new(Vec::<Vec<u8>>::new()), Condvar::new()));
            let pass = {
                let got = Arc::clone(&got);
                move |c: &mut Consumer, buf: &mut Vec<u8>| {
                    while c.try_pop(buf).unwrap() {
                        got.0.lock().unwrap().push(buf.clone());
                        got.1.notify_all();
                    }
                    true
                }
            };
            let reader = {
                let (lane, pass) = (Arc::clone(&lane), pass.clone());
                thread::spawn(move || lane.serve(pass))
            };
            let poller = {
                let lane = Arc::clone(&lane);
                thread::spawn(move || {
                    lane.take();
                    lane.poll(pass);
                    lane.hand_back();
                })
            };
            assert!(p.try_push(&record(0, 5)).unwrap());
            p.publish();
            assert!(p.try_push(&record(1, 3)).unwrap());
            p.publish();
            {
                let mut g = got.0.lock().unwrap();
                while g.len() < 2 {
                    g = got.1.wait(g).unwrap();
                }
                assert_eq!(*g, vec![record(0, 5), record(1, 3)]);
            }
            poller.join().unwrap();
            crate::close(&*heap);
            lane.wake();
            reader.join().unwrap();
        });
    }
}

#[cfg(not(loom))]
mod unit {
    use super::*;
    use crate::shm::{Capacities, SharedRing};
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn ends(mem: Arc<dyn Memory>) -> (Producer, Consumer) {
        (
            Producer::new(Arc::clone(&mem), Which::Complete),
            Consumer::new(mem, Which::Complete),
        )
    }

    proptest! {
        /// Any mix of pushes, publishes and pops gives what a queue gives.
        #[test]
        fn matches_a_queue(ops in proptest::collection::vec((0u8..3, 0usize..100), 1..400)) {
            let (mut p, mut c) = ends(Heap::new(256));
            let mut written = VecDeque::new();
            let mut published = VecDeque::new();
            let mut buf = Vec::new();
            for (i, (op, len)) in ops.into_iter().enumerate() {
                match op {
                    0 => {
                        let r = record(i, len % 121);
                        if p.try_push(&r).unwrap() {
                            written.push_back(r);
                        }
                    }
                    1 => {
                        p.publish();
                        published.extend(written.drain(..));
                    }
                    _ => {
                        let got = c.try_pop(&mut buf).unwrap();
                        prop_assert_eq!(got, !published.is_empty());
                        if got {
                            prop_assert_eq!(&buf, &published.pop_front().unwrap());
                        }
                        c.release();
                    }
                }
            }
        }
    }

    #[test]
    fn too_large_and_closed_are_refused() {
        let (mut p, _c) = ends(Heap::new(256));
        assert_eq!(
            p.try_push(&[0; 121]),
            Err(RingError::TooLarge { len: 121, max: 120 })
        );
        assert!(p.try_push(&[0; 120]).unwrap());
        crate::close(&**p.memory());
        assert_eq!(p.try_push(&[1]), Err(RingError::Closed));
    }

    #[test]
    fn a_hostile_producer_is_caught() {
        use crate::sync::Ordering;
        let heap = Heap::new(256);
        let mem: Arc<dyn Memory> = heap.clone();
        let lane = &heap.lanes[1];
        let mut buf = Vec::new();
        // A head past the capacity.
        lane.head.0.store(257, Ordering::Release);
        let mut c = Consumer::new(Arc::clone(&mem), Which::Complete);
        assert!(matches!(c.try_pop(&mut buf), Err(RingError::Corrupt(_))));
        // A header claiming more bytes than were published.
        let store = &heap.bytes[1];
        let bad = |len: u32, kind: u32, head: u64| {
            let mut h = [0u8; 8];
            h[..4].copy_from_slice(&len.to_le_bytes());
            h[4..].copy_from_slice(&kind.to_le_bytes());
            store.put(0, &h);
            lane.head.0.store(head, Ordering::Release);
            Consumer::new(Arc::clone(&mem), Which::Complete).try_pop(&mut Vec::new())
        };
        assert!(
            matches!(bad(100, 1, 16), Err(RingError::Corrupt(m)) if m.contains("does not fit"))
        );
        assert!(matches!(bad(4000, 1, 256), Err(RingError::Corrupt(_))));
        assert!(matches!(bad(8, 9, 16), Err(RingError::Corrupt(m)) if m.contains("kind 9")));
        assert!(matches!(bad(0, 1, 5), Err(RingError::Corrupt(_))));
        assert!(matches!(bad(0, 2, 16), Err(RingError::Corrupt(m)) if m.contains("pad")));
        assert_eq!(bad(8, 1, 16), Ok(true));
        // A tail that passed our head.
        let mut p = Producer::new(Arc::clone(&mem), Which::Submit);
        heap.lanes[0].tail.0.store(99, Ordering::Release);
        assert!(matches!(p.try_push(&[1]), Err(RingError::Corrupt(m)) if m.contains("tail")));
    }

    /// Two threads, a small ring, a million records: every one arrives in
    /// order, through full-ring waits and parked consumers.
    #[test]
    fn threads_stream_in_order() {
        let n = 200_000;
        let (mut p, mut c) = ends(Heap::new(4096));
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            for i in 0..n {
                loop {
                    if c.try_pop(&mut buf).unwrap() {
                        break;
                    }
                    assert_eq!(
                        c.wait(
                            Spin {
                                spins: 100,
                                yields: 0
                            },
                            None
                        ),
                        Waited::Ready
                    );
                }
                assert_eq!(buf, record(i, i % 50), "record {i}");
            }
            c.release();
        });
        for i in 0..n {
            assert!(
                p.push(
                    &record(i, i % 50),
                    Spin {
                        spins: 100,
                        yields: 0
                    },
                    None
                )
                .unwrap()
            );
            if i % 7 == 0 {
                p.publish();
            }
        }
        p.publish();
        reader.join().unwrap();
    }

    #[test]
    fn deadlines_end_waits() {
        let (mut p, mut c) = ends(Heap::new(256));
        let soon = Some(std::time::Instant::now() + std::time::Duration::from_millis(20));
        assert_eq!(c.wait(Spin::NONE, soon), Waited::TimedOut);
        assert!(p.try_push(&[0; 120]).unwrap());
        assert!(p.try_push(&[0; 120]).unwrap());
        assert_eq!(p.push(&[0; 120], Spin::NONE, soon), Ok(false));
    }

    /// The memfd: two mappings of one fd (as driver and worker have) carry
    /// records, and a file that is not the announced ring is refused.
    #[test]
    fn shared_memfd_round_trip_and_refusals() {
        let caps = Capacities {
            submit: 4096,
            complete: 8192,
        };
        let (a, fd) = SharedRing::create(caps).unwrap();
        let b = SharedRing::open(&fd, caps).unwrap();
        let a: Arc<dyn Memory> = Arc::new(a);
        let b: Arc<dyn Memory> = Arc::new(b);
        let mut p = Producer::new(a, Which::Submit);
        let mut c = Consumer::new(b, Which::Submit);
        for i in 0..1000 {
            assert!(p.push(&record(i, 77), Spin::NONE, None).unwrap());
            p.publish();
            let mut buf = Vec::new();
            assert!(c.try_pop(&mut buf).unwrap());
            assert_eq!(buf, record(i, 77));
            c.release();
        }
        let other = Capacities {
            submit: 8192,
            complete: 8192,
        };
        assert!(
            matches!(SharedRing::open(&fd, other), Err(RingError::Layout(m)) if m.contains("holds"))
        );
        assert!(matches!(
            Capacities { submit: 1000, complete: 4096 }.check(),
            Err(RingError::Layout(m)) if m.contains("submit capacity 1000")
        ));
        let plain = memfd::MemfdOptions::default().create("x").unwrap();
        plain.as_file().set_len(caps.file_len() as u64).unwrap();
        assert!(
            matches!(SharedRing::open(plain.as_file(), caps), Err(RingError::Layout(m)) if m.contains("magic"))
        );
    }
}
