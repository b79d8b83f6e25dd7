//! A staged copy as few DMA operations as its layout allows.
//!
//! A view's bytes are runs ([`crate::staging`]); a tile of a wide matrix is
//! thousands of equal runs at a constant stride. One copy call per run
//! would cost a microsecond or more each, so runs of one length, evenly
//! spaced on both sides, become one rectangle: a 2D copy (`cuMemcpy2D`)
//! of `height` rows of `width` bytes, `pitch` bytes apart on each side.

use strata_wire::Tensor;

use crate::staging::{Layout, for_each_run};

/// `height` rows of `width` bytes: row `r` goes from `src + r·src_pitch`
/// to `dst + r·dst_pitch` (offsets from the view's first byte on the host
/// side, from the copy's start on the device side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rect {
    pub(crate) host: u64,
    pub(crate) dev: u64,
    pub(crate) width: u64,
    pub(crate) height: u64,
    pub(crate) host_pitch: u64,
    pub(crate) dev_pitch: u64,
}

impl Rect {
    /// Bytes it moves.
    pub(crate) fn bytes(&self) -> u64 {
        self.width * self.height
    }
}

/// The rectangles that move `view`'s bytes between the host (from the
/// view's first byte) and its staged copy laid out as `layout` says.
pub(crate) fn rects(layout: Layout, view: &Tensor) -> Vec<Rect> {
    let mut out: Vec<Rect> = Vec::new();
    let mut packed_at = 0u64;
    for_each_run(view, |off, len| {
        let (host, len) = (off as u64, len as u64);
        let dev = match layout {
            Layout::Extent => host,
            Layout::Packed => {
                let d = packed_at;
                packed_at += len;
                d
            }
        };
        if let Some(r) = out.last_mut()
            && r.width == len
        {
            if r.height == 1 && host > r.host && dev >= r.dev + len && host >= r.host + len {
                // The second row sets the pitches.
                r.host_pitch = host - r.host;
                r.dev_pitch = dev - r.dev;
                r.height = 2;
                return;
            }
            if r.height > 1
                && host == r.host + r.height * r.host_pitch
                && dev == r.dev + r.height * r.dev_pitch
            {
                r.height += 1;
                return;
            }
        }
        out.push(Rect {
            host,
            dev,
            width: len,
            height: 1,
            host_pitch: len,
            dev_pitch: len,
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::check::{Rng, ViewClass, view_pair};

    /// Doing the rectangles by hand moves exactly what the layout's own
    /// copy moves, both ways, for every class of view.
    #[test]
    fn rectangles_move_what_the_layout_moves() {
        let mut rng = Rng(11);
        let mut merged = 0usize;
        for class in ViewClass::ALL {
            for _ in 0..1500 {
                let (v, _) = view_pair(class, &mut rng);
                let layout = Layout::of(&v);
                let extent = v.extent_bytes() as usize;
                let len = layout.len(&v) as usize;
                let host: Vec<u8> = (0..extent).map(|i| (i * 13 % 251) as u8 + 1).collect();
                let mut want = vec![0u8; len];
                // SAFETY: both buffers have the sizes the layout asks.
                let n = unsafe { layout.copy_in(&v, host.as_ptr(), want.as_mut_ptr()) };
                let mut got = vec![0u8; len];
                let plan = rects(layout, &v);
                let mut moved = 0;
                for r in &plan {
                    for row in 0..r.height {
                        let (h, d) = (
                            (r.host + row * r.host_pitch) as usize,
                            (r.dev + row * r.dev_pitch) as usize,
                        );
                        let w = r.width as usize;
                        got[d..d + w].copy_from_slice(&host[h..h + w]);
                    }
                    moved += r.bytes();
                }
                assert_eq!(got, want, "{class:?} {v:?} {plan:?}");
                assert_eq!(moved, n, "{class:?} {v:?}");
                // And back: only the view's bytes change on the host.
                let mut back = vec![0u8; extent];
                let mut expect = vec![0u8; extent];
                // SAFETY: as above.
                unsafe { layout.copy_out(&v, want.as_ptr(), expect.as_mut_ptr()) };
                for r in &plan {
                    for row in 0..r.height {
                        let (h, d) = (
                            (r.host + row * r.host_pitch) as usize,
                            (r.dev + row * r.dev_pitch) as usize,
                        );
                        let w = r.width as usize;
                        back[h..h + w].copy_from_slice(&want[d..d + w]);
                    }
                }
                assert_eq!(back, expect, "{class:?} {v:?}");
                merged += plan.iter().filter(|r| r.height > 1).count();
            }
        }
        assert!(merged > 0, "no view became a rectangle");
    }

    /// A 64×64 F32 tile of a 1024-wide matrix is one rectangle.
    #[test]
    fn a_tile_is_one_rectangle() {
        let buf = strata_wire::check::test_buffer(1024 * 1024 * 4);
        let tile = Tensor::new(
            buf,
            (3 * 1024 + 5) * 4,
            &[64, 64],
            &[1024, 1],
            strata_wire::DType::F32,
        )
        .unwrap();
        let plan = rects(Layout::of(&tile), &tile);
        assert_eq!(
            plan,
            vec![Rect {
                host: 0,
                dev: 0,
                width: 256,
                height: 64,
                host_pitch: 4096,
                dev_pitch: 256
            }]
        );
    }
}
