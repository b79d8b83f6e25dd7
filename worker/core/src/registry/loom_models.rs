use super::*;
use crate::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use strata_wire::check::test_buffer;

const S1: SessionId = SessionId(1);
const S2: SessionId = SessionId(2);

/// A mapping that counts its drops on its source's counter.
struct Tracked(Arc<AtomicUsize>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Maps a source (the counter its mapping's drops go to), counting maps.
struct Fake {
    maps: Arc<AtomicUsize>,
}
impl Mapper for Fake {
    type Source = Arc<AtomicUsize>;
    type Mapping = Tracked;
    fn map(&self, drops: &Arc<AtomicUsize>, _: &BufferDescriptor) -> Result<Tracked, String> {
        self.maps.fetch_add(1, Ordering::SeqCst);
        Ok(Tracked(Arc::clone(drops)))
    }
}

fn setup() -> (
    Arc<ImportRegistry<Fake>>,
    Arc<AtomicUsize>,
    Arc<AtomicUsize>,
    BufferDescriptor,
) {
    let maps = Arc::new(AtomicUsize::new(0));
    let drops = Arc::new(AtomicUsize::new(0));
    let reg = Arc::new(ImportRegistry::new(Fake {
        maps: Arc::clone(&maps),
    }));
    let buf = test_buffer(64);
    reg.offer(S1, *buf.identity(), Arc::clone(&drops)).unwrap();
    (reg, maps, drops, buf)
}

/// Two tasks resolve the same identity at once: it is mapped exactly
/// once and both get that mapping (IMPORT-1, IMPORT-3).
#[test]
fn concurrent_acquires_map_once() {
    loom::model(|| {
        let (reg, maps, drops, buf) = setup();
        let r = Arc::clone(&reg);
        let t = thread::spawn(move || r.acquire(S1, &buf).map(|m| Arc::as_ptr(&m) as usize));
        let mine = reg.acquire(S1, &buf).map(|m| Arc::as_ptr(&m) as usize);
        let theirs = t.join().unwrap();
        assert_eq!(mine.unwrap(), theirs.unwrap());
        assert_eq!(maps.load(Ordering::SeqCst), 1);
        assert!(reg.release(S1, buf.identity()));
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "dropped once, after release and the last lease"
        );
    });
}

/// A release racing a task's acquire: the task either gets the mapping
/// and keeps it valid until it lets go, or is told the buffer is not
/// imported; the mapping is dropped exactly once, never under a lease
/// (IMPORT-2).
#[test]
fn release_waits_for_the_last_lease() {
    loom::model(|| {
        let (reg, _maps, drops, buf) = setup();
        let r = Arc::clone(&reg);
        let d = Arc::clone(&drops);
        let t = thread::spawn(move || {
            if let Ok(lease) = r.acquire(S1, &buf) {
                assert_eq!(d.load(Ordering::SeqCst), 0, "mapping dropped under a lease");
                drop(lease);
            }
        });
        assert!(reg.release(S1, buf.identity()));
        t.join().unwrap();
        let dropped = drops.load(Ordering::SeqCst);
        let mapped = reg.mapper().maps.load(Ordering::SeqCst);
        assert_eq!(dropped, mapped, "every mapping made is dropped once");
        assert!(dropped <= 1);
    });
}

/// Two sessions imported the same identity; one session's task acquires
/// it while the other session releases its own (an explicit release, or
/// its end): the acquire always succeeds with its own session's mapping,
/// which is never dropped; the releasing session's mapping is dropped
/// exactly once (IMPORT-5, IMPORT-2).
#[test]
fn one_sessions_release_never_touches_anothers_import() {
    for whole_session in [false, true] {
        loom::model(move || {
            let (reg, maps, s1_drops, buf) = setup();
            let s2_drops = Arc::new(AtomicUsize::new(0));
            reg.offer(S2, *buf.identity(), Arc::clone(&s2_drops))
                .unwrap();
            // S2's import is mapped and its lease let go before the race.
            drop(reg.acquire(S2, &buf).unwrap());
            let r = Arc::clone(&reg);
            let d = Arc::clone(&s1_drops);
            let t = thread::spawn(move || {
                let lease = r.acquire(S1, &buf).expect("S1's import is S1's");
                assert_eq!(d.load(Ordering::SeqCst), 0, "S1's mapping dropped");
                drop(lease);
            });
            if whole_session {
                assert_eq!(reg.release_session(S2), 1);
            } else {
                assert!(reg.release(S2, buf.identity()));
            }
            t.join().unwrap();
            assert_eq!(s2_drops.load(Ordering::SeqCst), 1, "S2's dropped once");
            assert_eq!(s1_drops.load(Ordering::SeqCst), 0, "S1's still held");
            assert_eq!(maps.load(Ordering::SeqCst), 2, "one map per session");
            assert_eq!(reg.len(), 1);
            assert_eq!(reg.release_session(S1), 1);
            assert_eq!(s1_drops.load(Ordering::SeqCst), 1);
        });
    }
}
