//! The device cache against host memory alone.
//!
//! Random programs over overlapping views of a few F32 buffers — reads,
//! in-place updates (`axpy`), pure and keeping writes (`copy` as OUTPUT
//! and OUTPUT_EXISTING), kernels that write half their output and fail,
//! user allocations that evict copies, driver reads — run on two staged
//! chips whose persistent regions leave room for a handful of copies. The
//! test plays the caller's part the way an orchestrator must: it names the
//! version of every byte set a task reads, gives every write a new version
//! and, once it succeeded, a new version to every other byte set it
//! overlaps; before a task runs it has every dirty copy written back that
//! overlaps the task's bytes, except the task's own copy on its own chip.
//! The oracle is the same kernels run one by one on plain host memory
//! (a unified chip, failing tasks left out): after every driver read, host
//! memory must be byte-identical.

use std::collections::HashMap;
use std::sync::Arc;

use strata_chip_runtime::kernel::{ArgSpec, DTypes, Rank, Signature};
use strata_chip_runtime::{
    ArgBacking, CacheUse, Device, HostBuffer, Kernel, KernelContext, Launch, LaunchArg, Region,
    Registry, SimDevice, device,
};
use strata_wire::check::Rng;

use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType, Footprint,
    Overlap, Tensor,
};

const BUFFERS: usize = 3;
const ELEMS: u32 = 64;
const OWNER: u64 = 7;

/// Writes its argument's first half (×3 + 1) and fails.
struct HalfThenFail(Signature);

impl Kernel for HalfThenFail {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let mut y = ctx.output::<f32>(0)?;
        let n = y.geometry().shape()[0];
        for i in 0..n / 2 {
            let v = y.get(&[i]);
            y.set(&[i], v * 3.0 + 1.0);
        }
        Err("failed half way on purpose".into())
    }
}

fn registry() -> Registry {
    let mut reg = Registry::with_builtins();
    reg.register(Arc::new(HalfThenFail(Signature {
        name: "test.half_then_fail".into(),
        version: 1,
        args: vec![ArgSpec::new(
            "y",
            Access::ReadWrite,
            DTypes::Any,
            Rank::Exactly(1),
        )],
        scalars: vec![],
    })))
    .unwrap();
    reg
}

/// One step of a program.
#[derive(Debug, Clone)]
enum Step {
    /// `axpy(x, y; alpha)` on `chip`.
    Axpy {
        chip: usize,
        x: Tensor,
        y: Tensor,
        alpha: f64,
    },
    /// `copy(src, dst)` with dst tagged OUTPUT or OUTPUT_EXISTING.
    Copy {
        chip: usize,
        src: Tensor,
        dst: Tensor,
        keep: bool,
    },
    /// A kernel that writes half of `y` and fails.
    Fail { chip: usize, y: Tensor },
    /// A user block allocated (and freed `hold` steps later) on `chip`.
    Alloc { chip: usize, bytes: u64 },
    /// The driver reads every buffer.
    Read,
}

/// Which invalidation the caller does (the last is the broken one the
/// test must catch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Exact,
    NoInvalidation,
}

struct World {
    chips: [SimDevice; 2],
    reference: SimDevice,
    bufs: Vec<(BufferDescriptor, Arc<HostBuffer>, Arc<HostBuffer>)>,
    versions: HashMap<Footprint, u64>,
    next_version: u64,
    reg: Registry,
    caller: Caller,
    deferred: bool,
    user_blocks: Vec<(usize, strata_chip_runtime::device::DeviceAddr)>,
    /// A view of every byte set used, to enumerate a copy's bytes.
    views: HashMap<Footprint, Tensor>,
}

fn descriptor(i: usize) -> BufferDescriptor {
    let id = CanonicalIdentity::new(*b"cachetst", i as u64 + 1, 1).unwrap();
    BufferDescriptor::new(
        id,
        u64::from(ELEMS) * 4,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 1,
            st_ino: i as u64 + 1,
        },
    )
    .unwrap()
}

/// A chip whose persistent region has room for a few small copies once
/// `fill` bytes of it are taken by a user block.
fn small_chip() -> SimDevice {
    let d =
        SimDevice::from_spec("sim:mem=256KiB,run=64KiB,scratch=64KiB,mode=staged,lanes=1").unwrap();
    // 128 KiB persistent: leave 8 blocks' worth for copies.
    d.alloc(Region::Persistent, 128 * 1024 - 8 * 64).unwrap();
    d
}

impl World {
    fn new(rng: &mut Rng, caller: Caller, deferred: bool) -> World {
        let bufs = (0..BUFFERS)
            .map(|i| {
                let d = descriptor(i);
                let h = Arc::new(HostBuffer::new(d.nbytes() as usize).unwrap());
                let r = Arc::new(HostBuffer::new(d.nbytes() as usize).unwrap());
                let bytes: Vec<u8> = (0..ELEMS)
                    .flat_map(|_| ((rng.next_u64() % 17) as f32 - 8.0).to_le_bytes())
                    .collect();
                h.write(0, &bytes).unwrap();
                r.write(0, &bytes).unwrap();
                (d, h, r)
            })
            .collect();
        World {
            chips: [small_chip(), small_chip()],
            reference: SimDevice::from_spec("sim:mem=1MiB,mode=unified,lanes=1").unwrap(),
            bufs,
            versions: HashMap::new(),
            next_version: 1,
            reg: registry(),
            caller,
            deferred,
            user_blocks: Vec::new(),
            views: HashMap::new(),
        }
    }

    fn fresh(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    fn version(&mut self, f: Footprint) -> u64 {
        if let Some(&v) = self.versions.get(&f) {
            return v;
        }
        let v = self.fresh();
        self.versions.insert(f, v);
        v
    }

    fn host(&self, t: &Tensor, reference: bool) -> Arc<HostBuffer> {
        let (_, h, r) = self
            .bufs
            .iter()
            .find(|(d, ..)| d.identity() == t.identity())
            .unwrap();
        Arc::clone(if reference { r } else { h })
    }

    /// Writes back every dirty copy that overlaps `bytes`, but for the
    /// copy of exactly `bytes` on `chip` itself.
    fn flush_overlapping(&self, chip: usize, bytes: &[Footprint]) {
        for (d, dev) in self.chips.iter().enumerate() {
            for c in dev.cached() {
                if !c.dirty {
                    continue;
                }
                let hit = bytes.iter().any(|f| {
                    f.overlap(&c.key.footprint) != Overlap::Disjoint
                        && !(d == chip && *f == c.key.footprint)
                });
                if hit {
                    let key = c.key.footprint;
                    dev.flush(OWNER, &|f| *f == key);
                }
            }
        }
    }

    fn launch(
        &mut self,
        chip: usize,
        name: &str,
        args: &[(Tensor, ArgTag)],
        scalars: Vec<u64>,
    ) -> Result<(), strata_chip_runtime::Error> {
        let prints: Vec<Footprint> = args.iter().map(|(t, _)| Footprint::of(t)).collect();
        for ((t, _), f) in args.iter().zip(&prints) {
            self.views.insert(*f, *t);
        }
        self.flush_overlapping(chip, &prints);
        let kernel = self.reg.get(self.reg.find(name, 1).unwrap()).unwrap();
        let mut launch_args = Vec::new();
        let mut written = Vec::new();
        for ((t, tag), f) in args.iter().zip(&prints) {
            let version = self.version(*f);
            let after = self.fresh();
            if tag.writes() {
                written.push((*f, after));
            }
            launch_args.push(LaunchArg {
                tensor: *t,
                tag: *tag,
                backing: ArgBacking::Host(self.host(t, false)),
                cache: Some(CacheUse {
                    owner: OWNER,
                    version,
                    written: after,
                    deferred: self.deferred,
                    held: false,
                    footprint: None,
                }),
            });
        }
        let outcome = device::launch(
            &self.chips[chip],
            Launch {
                kernel: Arc::clone(&kernel),
                args: launch_args,
                scalars: scalars.clone(),
                gate: None,
                priority: 0,
            },
        )?
        .wait();
        if outcome.is_ok() {
            for (w, after) in written {
                if self.caller == Caller::Exact {
                    for (f, v) in &mut self.versions {
                        if *f != w && f.overlap(&w) != Overlap::Disjoint {
                            self.next_version += 1;
                            *v = self.next_version;
                        }
                    }
                }
                self.versions.insert(w, after);
            }
            let reference = args
                .iter()
                .map(|(t, tag)| LaunchArg {
                    tensor: *t,
                    tag: *tag,
                    backing: ArgBacking::Host(self.host(t, true)),
                    cache: None,
                })
                .collect();
            device::launch(
                &self.reference,
                Launch {
                    kernel,
                    args: reference,
                    scalars,
                    gate: None,
                    priority: 0,
                },
            )
            .unwrap()
            .wait()
            .unwrap();
        }
        outcome.map(drop)
    }

    /// The driver reads: everything dirty goes back first. `Err` names
    /// the first buffer that differs from the oracle.
    fn read(&self) -> Result<(), String> {
        for dev in &self.chips {
            let written = dev.flush(OWNER, &|_| true);
            // Written through, nothing is left to write back.
            if !self.deferred && written > 0 {
                return Err(format!("{written} bytes dirty on a write-through chip"));
            }
        }
        for (d, h, r) in &self.bufs {
            if h.to_vec() != r.to_vec() {
                return Err(format!("buffer {} differs from the oracle", d.identity()));
            }
        }
        Ok(())
    }

    /// The invariants of both chips, and the coherence the caller keeps:
    /// no two dirty copies share a byte, and host memory holds every byte
    /// that no chip holds dirty.
    fn check(&self) -> Result<(), String> {
        let mut dirty: HashMap<(CanonicalIdentity, u64), usize> = HashMap::new();
        for (i, dev) in self.chips.iter().enumerate() {
            dev.check_invariants()?;
            for c in dev.cached().into_iter().filter(|c| c.dirty) {
                let t = self.views[&c.key.footprint];
                for b in strata_wire::check::byte_set(&t).unwrap() {
                    if let Some(j) = dirty.insert((*t.identity(), b), i) {
                        return Err(format!("byte {b} dirty on chips {j} and {i}"));
                    }
                }
            }
        }
        for (d, h, r) in &self.bufs {
            let (h, r) = (h.to_vec(), r.to_vec());
            for (b, (x, y)) in h.iter().zip(&r).enumerate() {
                if x != y && !dirty.contains_key(&(*d.identity(), b as u64)) {
                    return Err(format!(
                        "byte {b} of buffer {} is stale in host memory and dirty nowhere",
                        d.identity()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A random 1-D F32 view of `n` elements in buffer `b`.
fn view(rng: &mut Rng, b: usize, n: u32) -> Tensor {
    let stride = 1 + (rng.next_u64() % 3) as u32;
    let span = (n - 1) * stride + 1;
    let start = (rng.next_u64() % u64::from(ELEMS - span + 1)) as u32;
    // A few fixed tiles, so that views repeat and copies are reused.
    let start = if rng.next_u64() % 2 == 0 {
        (start / 8) * 8
    } else {
        start
    };
    Tensor::new(
        descriptor(b),
        u64::from(start) * 4,
        &[n],
        &[stride],
        DType::F32,
    )
    .unwrap()
}

fn program(rng: &mut Rng, len: usize) -> Vec<Step> {
    // A few views per buffer and length, so that byte sets repeat and
    // copies are found again (overlapping ones included).
    let pool: Vec<Vec<Vec<Tensor>>> = (0..BUFFERS)
        .map(|b| {
            [2, 4, 8]
                .iter()
                .map(|&n| (0..3).map(|_| view(rng, b, n)).collect())
                .collect()
        })
        .collect();
    let pick = |rng: &mut Rng, b: usize, n: usize| pool[b][n][(rng.next_u64() % 3) as usize];
    (0..len)
        .map(|_| {
            let chip = (rng.next_u64() % 2) as usize;
            let n = (rng.next_u64() % 3) as usize;
            let (a, b) = (
                (rng.next_u64() % BUFFERS as u64) as usize,
                (rng.next_u64() % BUFFERS as u64) as usize,
            );
            let view = |rng: &mut Rng, b: usize, _: usize| pick(rng, b, n);
            match rng.next_u64() % 20 {
                0..=7 => Step::Axpy {
                    chip,
                    x: view(rng, a, n),
                    y: view(rng, b, n),
                    alpha: (rng.next_u64() % 5) as f64 - 2.0,
                },
                8..=13 => Step::Copy {
                    chip,
                    src: view(rng, a, n),
                    dst: view(rng, b, n),
                    keep: rng.next_u64() % 2 == 0,
                },
                14..=15 => Step::Fail {
                    chip,
                    y: view(rng, b, n),
                },
                16..=17 => Step::Alloc {
                    chip,
                    bytes: 64 * (1 + rng.next_u64() % 5),
                },
                _ => Step::Read,
            }
        })
        .collect()
}

/// Runs a program; `Err` names the first divergence from the oracle.
fn run(seed: u64, caller: Caller, deferred: bool) -> Result<(), String> {
    let mut rng = Rng(seed);
    let mut w = World::new(&mut rng, caller, deferred);
    for (i, step) in program(&mut rng, 120).into_iter().enumerate() {
        let at = |e: String| format!("seed {seed}, step {i} ({step:?}): {e}");
        if std::env::var("CACHE_DEBUG").is_ok_and(|v| v == seed.to_string()) {
            for (c, dev) in w.chips.iter().enumerate() {
                for k in dev.cached() {
                    let t = w.views[&k.key.footprint];
                    eprintln!(
                        "  chip {c}: buf {} off {} n {} s {} v{} dirty {} ",
                        t.identity().buffer_id(),
                        t.byte_offset(),
                        t.shape()[0],
                        t.strides()[0],
                        k.version,
                        k.dirty
                    );
                }
                eprintln!("  chip {c} stats {:?}", dev.stats().cache);
            }
            eprintln!("step {i}: {step:?}");
        }
        match &step {
            Step::Axpy { chip, x, y, alpha } => {
                if x.identity() == y.identity()
                    && Footprint::of(x).overlap(&Footprint::of(y)) != Overlap::Disjoint
                {
                    continue;
                }
                w.launch(
                    *chip,
                    "axpy",
                    &[(*x, ArgTag::Input), (*y, ArgTag::InOut)],
                    vec![alpha.to_bits()],
                )
                .map_err(|e| at(e.to_string()))?;
            }
            Step::Copy {
                chip,
                src,
                dst,
                keep,
            } => {
                if Footprint::of(src).overlap(&Footprint::of(dst)) != Overlap::Disjoint {
                    continue;
                }
                let tag = if *keep {
                    ArgTag::OutputExisting
                } else {
                    ArgTag::Output
                };
                w.launch(*chip, "copy", &[(*src, ArgTag::Input), (*dst, tag)], vec![])
                    .map_err(|e| at(e.to_string()))?;
            }
            Step::Fail { chip, y } => {
                let e = w
                    .launch(*chip, "test.half_then_fail", &[(*y, ArgTag::InOut)], vec![])
                    .unwrap_err();
                if !e.to_string().contains("on purpose") {
                    return Err(at(format!("unexpected failure: {e}")));
                }
            }
            Step::Alloc { chip, bytes } => {
                // A user block outranks copies: it must fit by evicting
                // (one held at a time, in the room left for copies).
                if let Some((c, addr)) = w.user_blocks.pop() {
                    w.chips[c].free(addr).unwrap();
                }
                let b = w.chips[*chip]
                    .alloc(Region::Persistent, *bytes)
                    .map_err(|e| at(format!("user block refused: {e}")))?;
                w.user_blocks.push((*chip, b.addr));
            }
            Step::Read => w.read().map_err(at)?,
        }
        w.check().map_err(at)?;
    }
    w.read()
        .map_err(|e| format!("seed {seed}, at the end: {e}"))?;
    for dev in &w.chips {
        let s = dev.stats().cache;
        assert!(s.hits + s.misses > 0, "seed {seed}: the cache was used");
        dev.drop_copies(OWNER, None);
        assert_eq!(dev.stats().cache.entries, 0);
        dev.check_invariants().unwrap();
    }
    Ok(())
}

#[test]
fn cached_programs_match_host_memory_alone() {
    let mut totals = strata_chip_runtime::CacheStats::default();
    // More with STRATA_CACHE_SEEDS (a release run takes thousands).
    let seeds = std::env::var("STRATA_CACHE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(80u64);
    for seed in 0..seeds {
        let deferred = seed % 2 == 0;
        run(seed, Caller::Exact, deferred).unwrap();
    }
    // The programs reuse, evict and write back: the cache was exercised.
    let mut rng = Rng(1);
    let mut w = World::new(&mut rng, Caller::Exact, true);
    for step in program(&mut rng, 400) {
        if let Step::Axpy { chip, x, y, alpha } = step
            && Footprint::of(&x).overlap(&Footprint::of(&y)) == Overlap::Disjoint
        {
            w.launch(
                chip,
                "axpy",
                &[(x, ArgTag::Input), (y, ArgTag::InOut)],
                vec![alpha.to_bits()],
            )
            .unwrap();
        }
    }
    w.read().unwrap();
    for dev in &w.chips {
        let s = dev.stats().cache;
        totals.hits += s.hits;
        totals.evictions += s.evictions;
        totals.write_backs += s.write_backs;
        totals.device_to_device += s.device_to_device;
    }
    assert!(totals.hits > 0, "{totals:?}");
    assert!(totals.evictions > 0, "{totals:?}");
    assert!(totals.write_backs > 0, "{totals:?}");
    assert!(totals.device_to_device > 0, "{totals:?}");
    eprintln!("400 steps: {totals:?}");
}

/// The differential can fail: a caller that does not invalidate the copies
/// a write overlaps is caught.
#[test]
fn without_invalidation_the_differential_fails() {
    let caught = (0..20)
        .filter(|&seed| run(seed, Caller::NoInvalidation, seed % 2 == 0).is_err())
        .count();
    assert!(caught > 0, "no seed caught stale copies");
    eprintln!("{caught} of 20 seeds caught stale copies");
}

fn one(
    kernel: &str,
    reg: &Registry,
    dev: &SimDevice,
    args: Vec<LaunchArg>,
    scalars: Vec<u64>,
) -> Result<(), strata_chip_runtime::Error> {
    crate::common::run(dev, reg, kernel, args, scalars).map(drop)
}

fn cached_arg(
    t: Tensor,
    tag: ArgTag,
    host: &Arc<HostBuffer>,
    owner: u64,
    version: u64,
    written: u64,
) -> LaunchArg {
    LaunchArg {
        tensor: t,
        tag,
        backing: ArgBacking::Host(host.clone()),
        cache: Some(CacheUse {
            owner,
            version,
            written,
            deferred: true,
            held: false,
            footprint: None,
        }),
    }
}

/// A kernel that fails half way through updating bytes the chip holds
/// dirty leaves them as they were: the flush afterwards writes the
/// earlier task's bytes, not a half-updated mix.
#[test]
fn a_failed_update_keeps_the_dirty_bytes() {
    let reg = registry();
    let dev = SimDevice::from_spec("sim:mem=16MiB,mode=staged").unwrap();
    let (src, dst) = (descriptor(0), descriptor(1));
    let (hs, hd) = (
        Arc::new(HostBuffer::new(256).unwrap()),
        Arc::new(HostBuffer::new(256).unwrap()),
    );
    let ones: Vec<u8> = (0..8).flat_map(|_| 1f32.to_le_bytes()).collect();
    hs.write(0, &ones).unwrap();
    let s = Tensor::new(src, 0, &[8], &[1], DType::F32).unwrap();
    let d = Tensor::new(dst, 0, &[8], &[1], DType::F32).unwrap();
    one(
        "copy",
        &reg,
        &dev,
        vec![
            cached_arg(s, ArgTag::Input, &hs, 1, 1, 0),
            cached_arg(d, ArgTag::Output, &hd, 1, 0, 2),
        ],
        vec![],
    )
    .unwrap();
    assert_eq!(
        hd.read(0, 32).unwrap(),
        vec![0; 32],
        "dirty: not yet in host memory"
    );
    let e = one(
        "test.half_then_fail",
        &reg,
        &dev,
        vec![cached_arg(d, ArgTag::InOut, &hd, 1, 2, 3)],
        vec![],
    )
    .unwrap_err();
    assert!(e.to_string().contains("on purpose"), "{e}");
    assert_eq!(dev.flush(1, &|_| true), 32);
    assert_eq!(
        hd.read(0, 32).unwrap(),
        ones,
        "the copy's bytes, untouched by the failure"
    );
    assert_eq!(
        dev.stats().cache.device_to_device,
        32,
        "the failed kernel worked on a copy"
    );
    dev.check_invariants().unwrap();
}

/// Copies belong to their owner: another owner naming the same bytes at
/// the same version gets host memory's bytes, never the first owner's
/// dirty ones; dropping an owner's copies writes nothing back.
#[test]
fn copies_are_per_owner_and_dropped_without_write_back() {
    let reg = registry();
    let dev = SimDevice::from_spec("sim:mem=16MiB,mode=staged").unwrap();
    let (src, dst, out) = (descriptor(0), descriptor(1), descriptor(2));
    let hosts: Vec<_> = (0..3)
        .map(|_| Arc::new(HostBuffer::new(256).unwrap()))
        .collect();
    let twos: Vec<u8> = (0..8).flat_map(|_| 2f32.to_le_bytes()).collect();
    hosts[0].write(0, &twos).unwrap();
    let v = |b| Tensor::new(b, 0, &[8], &[1], DType::F32).unwrap();
    one(
        "copy",
        &reg,
        &dev,
        vec![
            cached_arg(v(src), ArgTag::Input, &hosts[0], 1, 1, 0),
            cached_arg(v(dst), ArgTag::Output, &hosts[1], 1, 0, 5),
        ],
        vec![],
    )
    .unwrap();
    // Owner 2 reads dst "at version 5": a miss, from host memory (zeros).
    one(
        "copy",
        &reg,
        &dev,
        vec![
            cached_arg(v(dst), ArgTag::Input, &hosts[1], 2, 5, 0),
            cached_arg(v(out), ArgTag::Output, &hosts[2], 2, 0, 6),
        ],
        vec![],
    )
    .unwrap();
    assert_eq!(dev.stats().cache.hits, 0);
    dev.flush(2, &|_| true);
    assert_eq!(
        hosts[2].read(0, 32).unwrap(),
        vec![0; 32],
        "owner 1's dirty bytes stayed its own"
    );
    assert_eq!(dev.drop_copies(1, None), 2);
    assert_eq!(
        hosts[1].read(0, 32).unwrap(),
        vec![0; 32],
        "dropped, not written back"
    );
    assert_eq!(dev.drop_copies(2, None), 2);
    assert_eq!(dev.stats().cache.entries, 0);
    assert_eq!(dev.stats().arena.persistent.in_use, 0);
    dev.check_invariants().unwrap();
}

/// An argument whose bytes did not come with the task (held) is read from
/// the chip's copy at the version named, even with host memory empty, and
/// fails the launch before the kernel runs — writing nothing — when the
/// chip does not hold that version, or could never hold it (a unified
/// chip).
#[test]
fn held_bytes_come_from_the_copy_or_the_launch_fails() {
    let reg = registry();
    let dev = SimDevice::from_spec("sim:mem=16MiB,mode=staged").unwrap();
    let (src, dst) = (descriptor(0), descriptor(1));
    let (full, empty, out) = (
        Arc::new(HostBuffer::new(256).unwrap()),
        Arc::new(HostBuffer::new(256).unwrap()),
        Arc::new(HostBuffer::new(256).unwrap()),
    );
    let threes: Vec<u8> = (0..8).flat_map(|_| 3f32.to_le_bytes()).collect();
    full.write(0, &threes).unwrap();
    let v = |b| Tensor::new(b, 0, &[8], &[1], DType::F32).unwrap();
    let held = |host: &Arc<HostBuffer>, version| {
        let mut a = cached_arg(v(src), ArgTag::Input, host, 1, version, 0);
        if let Some(c) = a.cache.as_mut() {
            c.held = true;
        }
        a
    };
    let output = || cached_arg(v(dst), ArgTag::Output, &out, 1, 0, 9);
    // Nothing on the chip yet.
    let e = one("copy", &reg, &dev, vec![held(&empty, 1), output()], vec![]).unwrap_err();
    assert!(
        matches!(e, strata_chip_runtime::Error::NotHeld { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("holds no copy"), "{e}");
    // Sent once (version 1), then held.
    one(
        "copy",
        &reg,
        &dev,
        vec![cached_arg(v(src), ArgTag::Input, &full, 1, 1, 0), output()],
        vec![],
    )
    .unwrap();
    dev.drop_copies(1, Some(&dst.identity().clone()));
    out.write(0, &[0; 32]).unwrap();
    one("copy", &reg, &dev, vec![held(&empty, 1), output()], vec![]).unwrap();
    dev.flush(1, &|_| true);
    assert_eq!(
        out.read(0, 32).unwrap(),
        threes,
        "read from the chip's copy"
    );
    // Another version is not there.
    out.write(0, &[0; 32]).unwrap();
    let e = one("copy", &reg, &dev, vec![held(&empty, 2), output()], vec![]).unwrap_err();
    assert!(e.to_string().contains("holds version 1"), "{e}");
    dev.flush(1, &|_| true);
    assert_eq!(
        out.read(0, 32).unwrap(),
        vec![0; 32],
        "the kernel never ran"
    );
    // A unified chip holds nothing.
    let unified = SimDevice::from_spec("sim:mem=16MiB,mode=unified").unwrap();
    let e = one(
        "copy",
        &reg,
        &unified,
        vec![held(&empty, 1), output()],
        vec![],
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("unified chip keeps no copies"),
        "{e}"
    );
    dev.check_invariants().unwrap();
}

/// Runs until its gate opens (a test's way to keep a lane busy).
struct Gate(Signature, Arc<std::sync::atomic::AtomicBool>);

impl Kernel for Gate {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !self.1.load(std::sync::atomic::Ordering::Acquire) {
            if std::time::Instant::now() > until {
                return Err("the gate never opened".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }
}

/// A launch that waits for the lane has the bytes it reads copied into
/// the cache meanwhile: its own staging then finds them, and its report
/// counts them as copied in (once, as a miss, not as a hit); with
/// `prefetch=off` nothing moves until the lane takes it.
#[test]
fn a_waiting_launch_has_its_bytes_copied_ahead() {
    for prefetch in [true, false] {
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut reg = registry();
        reg.register(Arc::new(Gate(
            Signature {
                name: "test.gate".into(),
                version: 1,
                args: vec![],
                scalars: vec![],
            },
            Arc::clone(&open),
        )))
        .unwrap();
        let spec = format!(
            "sim:mem=16MiB,mode=staged,prefetch={}",
            if prefetch { "on" } else { "off" }
        );
        let dev = SimDevice::from_spec(&spec).unwrap();
        let (src, dst) = (descriptor(0), descriptor(1));
        let (hs, hd) = (
            Arc::new(HostBuffer::new(256).unwrap()),
            Arc::new(HostBuffer::new(256).unwrap()),
        );
        let fives: Vec<u8> = (0..8).flat_map(|_| 5f32.to_le_bytes()).collect();
        hs.write(0, &fives).unwrap();
        let v = |b| Tensor::new(b, 0, &[8], &[1], DType::F32).unwrap();
        let launch = |name: &str, args| {
            let kernel = reg.get(reg.find(name, 1).unwrap()).unwrap();
            device::launch(
                &dev,
                Launch {
                    kernel,
                    args,
                    scalars: vec![],
                    gate: None,
                    priority: 0,
                },
            )
            .unwrap()
        };
        let busy = launch("test.gate", vec![]);
        let copy = launch(
            "copy",
            vec![
                cached_arg(v(src), ArgTag::Input, &hs, 1, 1, 0),
                cached_arg(v(dst), ArgTag::Output, &hd, 1, 0, 2),
            ],
        );
        if prefetch {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while dev.stats().cache.prefetched == 0 {
                assert!(std::time::Instant::now() < until, "nothing was prefetched");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        } else {
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(
                dev.stats().cache.loaded,
                0,
                "copied before its lane was free"
            );
        }
        open.store(true, std::sync::atomic::Ordering::Release);
        busy.wait().unwrap();
        let r = copy.wait().unwrap();
        assert_eq!(r.staged_in, 32, "{r:?}");
        assert_eq!((r.cache.misses, r.cache.hits), (1, 0), "{r:?}");
        assert_eq!(r.cache.prefetched, if prefetch { 32 } else { 0 }, "{r:?}");
        assert_eq!(dev.stats().cache.prefetched, r.cache.prefetched);
        dev.flush(1, &|_| true);
        assert_eq!(hd.read(0, 32).unwrap(), fives);
        dev.check_invariants().unwrap();
    }
}

/// Fills its output with 7 once its gate opens.
struct GatedFill(Signature, Arc<std::sync::atomic::AtomicBool>);

impl Kernel for GatedFill {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !self.1.load(std::sync::atomic::Ordering::Acquire) {
            if std::time::Instant::now() > until {
                return Err("the gate never opened".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut y = ctx.output::<f32>(0)?;
        for i in 0..y.geometry().shape()[0] {
            y.set(&[i], 7.0);
        }
        Ok(())
    }
}

/// Letting go of one buffer's copies while a kernel writes another
/// buffer's bytes (kept dirty) does not cost that write: the block becomes
/// the copy, and a flush writes it back.
#[test]
fn dropping_one_buffer_keeps_a_write_to_another() {
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut reg = registry();
    reg.register(Arc::new(GatedFill(
        Signature {
            name: "test.gated_fill".into(),
            version: 1,
            args: vec![ArgSpec::new(
                "y",
                Access::Write,
                DTypes::Any,
                Rank::Exactly(1),
            )],
            scalars: vec![],
        },
        Arc::clone(&open),
    )))
    .unwrap();
    let dev = SimDevice::from_spec("sim:mem=16MiB,mode=staged").unwrap();
    let (other, dst) = (descriptor(0), descriptor(1));
    let hd = Arc::new(HostBuffer::new(256).unwrap());
    let d = Tensor::new(dst, 0, &[8], &[1], DType::F32).unwrap();
    let kernel = reg.get(reg.find("test.gated_fill", 1).unwrap()).unwrap();
    let run = device::launch(
        &dev,
        Launch {
            kernel,
            args: vec![cached_arg(d, ArgTag::Output, &hd, 1, 0, 2)],
            scalars: vec![],
            gate: None,
            priority: 0,
        },
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    dev.drop_copies(1, Some(other.identity()));
    open.store(true, std::sync::atomic::Ordering::Release);
    run.wait().unwrap();
    assert_eq!(dev.flush(1, &|_| true), 32, "the write became a dirty copy");
    let sevens: Vec<u8> = (0..8).flat_map(|_| 7f32.to_le_bytes()).collect();
    assert_eq!(hd.read(0, 32).unwrap(), sevens);
    dev.check_invariants().unwrap();
}
