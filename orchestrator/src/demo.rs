//! The jobs `strata demo` runs, also used by the examples and the
//! cross-process tests: each builds its inputs, runs on a [`Cluster`], and
//! checks the result against a single-threaded reference.

use std::time::{Duration, Instant};

use crate::summary::RunSummary;
use crate::{Cluster, Error, Task, WorkerId};
use strata_wire::DType;

/// Deterministic pseudo-random values in [-1, 1) (splitmix64).
pub fn random_values(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = strata_wire::check::Rng(seed);
    (0..n)
        .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        .collect()
}

/// `a · b` for row-major `n × n` matrices, accumulated in f64.
pub fn reference_matmul(a: &[f32], b: &[f32], n: usize) -> Vec<f32> {
    let mut c = vec![0f32; n * n];
    let mut row = vec![0f64; n];
    for i in 0..n {
        row.iter_mut().for_each(|x| *x = 0.0);
        for k in 0..n {
            let aik = f64::from(a[i * n + k]);
            for (x, &bkj) in row.iter_mut().zip(&b[k * n..(k + 1) * n]) {
                *x += aik * f64::from(bkj);
            }
        }
        for (cij, x) in c[i * n..(i + 1) * n].iter_mut().zip(&row) {
            *cij = *x as f32;
        }
    }
    c
}

/// Row softmax of a row-major matrix with rows of `cols`, in f64.
pub fn reference_softmax(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for r in x.chunks(cols) {
        let m = r
            .iter()
            .map(|&v| f64::from(v))
            .fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = r.iter().map(|&v| (f64::from(v) - m).exp()).collect();
        let s: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| (v / s) as f32));
    }
    out
}

/// The demo's workload: `C = A · B` in `tile × tile` tiles, accumulated
/// in device buffers (one block of `tile` rows of C per device, blocks
/// dealt round-robin over the workers), then per block a row softmax of C
/// into a second device buffer, copied back to the host, and the row sums
/// of C reduced into a host vector: `(n/tile)³ + 3·n/tile` tasks.
/// Checked against [`reference_matmul`] and [`reference_softmax`].
///
/// # Errors
/// A refused submit or a failed task; `n` not a multiple of `tile`.
pub fn matmul_softmax_reduce(
    cluster: &Cluster,
    n: u32,
    tile: u32,
    seed: u64,
) -> Result<JobReport, Error> {
    if tile == 0 || n % tile != 0 {
        return Err(Error::Submit(crate::SubmitError::Job(format!(
            "{n} is not a multiple of the tile {tile}"
        ))));
    }
    let workers: Vec<WorkerId> = cluster.workers().iter().map(|w| w.id).collect();
    let nn = (n as usize) * (n as usize);
    let a_host = random_values(seed, nn);
    let b_host = random_values(seed ^ 0x5eed, nn);
    let a = cluster.buffer_from_slice(&a_host)?;
    let b = cluster.buffer_from_slice(&b_host)?;
    let s_out = cluster.buffer(nn as u64 * 4)?;
    let sums = cluster.buffer(u64::from(n) * 4)?;
    let tiles = n / tile;
    let (t64, n64) = (u64::from(tile), u64::from(n));
    let tile_of = |buf: &crate::Buffer, row: u32, col: u32| {
        buf.view(
            (u64::from(row) * t64 * n64 + u64::from(col) * t64) * 4,
            &[tile, tile],
            &[n, 1],
            DType::F32,
        )
    };
    let start = Instant::now();
    let mut tasks = 0u64;
    let block_bytes = t64 * n64 * 4;
    for i in 0..tiles {
        let w = workers[i as usize % workers.len()];
        let c = cluster.device_buffer(w, block_bytes)?;
        let soft = cluster.device_buffer(w, block_bytes)?;
        for j in 0..tiles {
            let ct = c.view(u64::from(j) * t64 * 4, &[tile, tile], &[n, 1], DType::F32)?;
            for k in 0..tiles {
                let (at, bt) = (tile_of(&a, i, k)?, tile_of(&b, k, j)?);
                let t = if k == 0 {
                    Task::new("matmul").input(&at).input(&bt).output(&ct)
                } else {
                    Task::new("matmul_acc").input(&at).input(&bt).inout(&ct)
                };
                cluster.submit(t)?;
                tasks += 1;
            }
        }
        let cv = c.tensor(&[tile, n], DType::F32)?;
        let sv = soft.tensor(&[tile, n], DType::F32)?;
        let out_rows = s_out.tensor_at(u64::from(i) * block_bytes, &[tile, n], DType::F32)?;
        let sum_rows = sums.tensor_at(u64::from(i) * t64 * 4, &[tile], DType::F32)?;
        cluster.submit(Task::new("softmax").input(&cv).output(&sv))?;
        cluster.submit(Task::new("copy").input(&sv).output(&out_rows))?;
        cluster.submit(Task::new("reduce_sum").input(&cv).output(&sum_rows))?;
        tasks += 3;
    }
    let summary = cluster.wait_all()?;
    let wall = start.elapsed();
    let c_ref = reference_matmul(&a_host, &b_host, n as usize);
    let s_ref = reference_softmax(&c_ref, n as usize);
    let sum_ref: Vec<f32> = c_ref
        .chunks(n as usize)
        .map(|r| r.iter().map(|&v| f64::from(v)).sum::<f64>() as f32)
        .collect();
    // Row sums add n products of sums of n terms: scale the error by n.
    let err_sums = max_abs_diff(&sums.to_vec::<f32>()?, &sum_ref) / f64::from(n);
    let err_soft = max_abs_diff(&s_out.to_vec::<f32>()?, &s_ref);
    Ok(JobReport {
        tasks,
        wall,
        max_abs_err: err_sums.max(err_soft),
        summary,
    })
}

/// What a job did.
#[derive(Debug, Clone)]
pub struct JobReport {
    /// Tasks submitted.
    pub tasks: u64,
    /// From the first submit to the last completion.
    pub wall: Duration,
    /// Largest difference from the reference.
    pub max_abs_err: f64,
    /// The run's figures.
    pub summary: RunSummary,
}

impl JobReport {
    /// Whether the result is within `tol` of the reference.
    pub fn ok(&self, tol: f64) -> bool {
        self.max_abs_err <= tol
    }
}

fn max_abs_diff(x: &[f32], y: &[f32]) -> f64 {
    x.iter()
        .zip(y)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).abs())
        .fold(0.0, f64::max)
}

/// `C = A · B` for `n × n` F32 matrices in `tile × tile` tiles: for every
/// tile of C, one `matmul` then `n/tile − 1` `matmul_acc` tasks, each
/// naming strided tile views of the row-major matrices (so `(n/tile)³`
/// tasks, chained per C tile and independent across tiles). Checked
/// against [`reference_matmul`].
///
/// # Errors
/// A refused submit or a failed task; `n` not a multiple of `tile`.
pub fn tiled_matmul(cluster: &Cluster, n: u32, tile: u32, seed: u64) -> Result<JobReport, Error> {
    if tile == 0 || n % tile != 0 {
        return Err(Error::Submit(crate::SubmitError::Job(format!(
            "{n} is not a multiple of the tile {tile}"
        ))));
    }
    let nn = (n as usize) * (n as usize);
    let a_host = random_values(seed, nn);
    let b_host = random_values(seed ^ 0xabcd, nn);
    let a = cluster.buffer_from_slice(&a_host)?;
    let b = cluster.buffer_from_slice(&b_host)?;
    let c = cluster.buffer(nn as u64 * 4)?;
    let tiles = n / tile;
    let view = |buf: &crate::Buffer, row: u32, col: u32| {
        let offset = (u64::from(row) * u64::from(tile) * u64::from(n)
            + u64::from(col) * u64::from(tile))
            * 4;
        buf.view(offset, &[tile, tile], &[n, 1], DType::F32)
    };
    let start = Instant::now();
    let mut tasks = 0u64;
    for i in 0..tiles {
        for j in 0..tiles {
            for k in 0..tiles {
                let (ta, tb, tc) = (view(&a, i, k)?, view(&b, k, j)?, view(&c, i, j)?);
                let t = if k == 0 {
                    Task::new("matmul").input(&ta).input(&tb).output(&tc)
                } else {
                    Task::new("matmul_acc").input(&ta).input(&tb).inout(&tc)
                };
                cluster.submit(t)?;
                tasks += 1;
            }
        }
    }
    let summary = cluster.wait_all()?;
    let wall = start.elapsed();
    let want = reference_matmul(&a_host, &b_host, n as usize);
    let got = c.to_vec::<f32>()?;
    Ok(JobReport {
        tasks,
        wall,
        max_abs_err: max_abs_diff(&got, &want),
        summary,
    })
}

/// A two-stage pipeline whose intermediates never leave the devices: the
/// `rows × cols` F32 input is cut into one block of rows per worker; on
/// each worker, stage 1 copies its block into a device buffer and squares
/// it into a second one (`mul`), stage 2 takes a row softmax into a third
/// and copies the result back into the host output. Checked against
/// `softmax(x · x)` computed here.
///
/// # Errors
/// A refused submit or a failed task.
pub fn pipeline(cluster: &Cluster, rows: u32, cols: u32, seed: u64) -> Result<JobReport, Error> {
    let workers: Vec<WorkerId> = cluster.workers().iter().map(|w| w.id).collect();
    let n = (rows as usize) * (cols as usize);
    let x_host = random_values(seed, n);
    let x = cluster.buffer_from_slice(&x_host)?;
    let y = cluster.buffer(n as u64 * 4)?;
    let block = rows.div_ceil(workers.len() as u32);
    let start = Instant::now();
    let mut tasks = 0u64;
    let mut row = 0u32;
    for &w in &workers {
        if row >= rows {
            break;
        }
        let r = block.min(rows - row);
        let bytes = u64::from(r) * u64::from(cols) * 4;
        let offset = u64::from(row) * u64::from(cols) * 4;
        let xin = x.tensor_at(offset, &[r, cols], DType::F32)?;
        let yout = y.tensor_at(offset, &[r, cols], DType::F32)?;
        let d0 = cluster
            .device_buffer(w, bytes)?
            .tensor(&[r, cols], DType::F32)?;
        let d1 = cluster
            .device_buffer(w, bytes)?
            .tensor(&[r, cols], DType::F32)?;
        let d2 = cluster
            .device_buffer(w, bytes)?
            .tensor(&[r, cols], DType::F32)?;
        // Stage 1.
        cluster.submit(Task::new("copy").input(&xin).output(&d0))?;
        cluster.submit(Task::new("mul").input(&d0).input(&d0).output(&d1))?;
        // Stage 2.
        cluster.submit(Task::new("softmax").input(&d1).output(&d2))?;
        cluster.submit(Task::new("copy").input(&d2).output(&yout))?;
        tasks += 4;
        row += r;
    }
    let summary = cluster.wait_all()?;
    let wall = start.elapsed();
    let mut want = Vec::with_capacity(n);
    for r in x_host.chunks(cols as usize) {
        let sq: Vec<f64> = r.iter().map(|&v| f64::from(v) * f64::from(v)).collect();
        let m = sq.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = sq.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        want.extend(e.iter().map(|v| (v / s) as f32));
    }
    let got = y.to_vec::<f32>()?;
    Ok(JobReport {
        tasks,
        wall,
        max_abs_err: max_abs_diff(&got, &want),
        summary,
    })
}

/// The `n × n` symmetric positive definite matrix the Cholesky job
/// factors: `a[i][j] = 1/(i + j + 1) + n·[i = j]` (a Hilbert matrix made
/// diagonally dominant), cheap to build and to multiply by a vector.
pub fn cholesky_matrix_element(n: u32, i: usize, j: usize) -> f64 {
    1.0 / (i + j + 1) as f64 + if i == j { f64::from(n) } else { 0.0 }
}

/// [`cholesky_matrix_element`]'s `n × n` matrix in `T`, row-major, its
/// row bands filled on every core (an n = 32768 matrix is 10⁹ elements,
/// seconds on one core).
fn cholesky_matrix<T: strata_chip_runtime::kernel::Element>(n: u32) -> Vec<T> {
    let size = n as usize;
    let mut host = vec![T::from_f64(0.0); size * size];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let band = size.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (b, rows) in host.chunks_mut(band * size.max(1)).enumerate() {
            s.spawn(move || {
                for (r, row) in rows.chunks_mut(size).enumerate() {
                    let i = b * band + r;
                    for (j, v) in row.iter_mut().enumerate() {
                        *v = T::from_f64(cholesky_matrix_element(n, i, j));
                    }
                }
            });
        }
    });
    host
}

/// A right-looking tiled Cholesky of [`cholesky_matrix_element`]'s matrix,
/// `n × n` in `T` (f32 or f64) cut into `tile × tile` tiles of one
/// row-major buffer: for each column `k` of tiles, `potrf` on the diagonal
/// tile, `trsm` on the tiles below it, then `syrk` on the diagonal tiles
/// and `gemm` (α = −1, β = 1, the second operand a transposed view) on the
/// tiles below the diagonal of the trailing matrix — `T(T+1)(T+2)/6` tasks
/// for `T = n/tile`, submitted in that order, their dependencies inferred.
///
/// Checked without an O(n³) product: for a random `x`, `L·(Lᵀ·x)` against
/// `A·x`; `max_abs_err` is the relative residual
/// `‖L·Lᵀ·x − A·x‖∞ / ‖A·x‖∞`.
///
/// # Errors
/// A refused submit or a failed task; `n` not a multiple of `tile`; `T`
/// not F32 or F64.
pub fn cholesky<T: strata_chip_runtime::kernel::Element>(
    cluster: &Cluster,
    n: u32,
    tile: u32,
) -> Result<JobReport, Error> {
    let mut runs = cholesky_runs::<T>(cluster, n, tile, 1)?;
    runs.pop()
        .ok_or_else(|| Error::Submit(crate::SubmitError::Job("no run".into())))
}

/// Where the Cholesky job's matrix lives while it is factored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixHome {
    /// A host buffer: each task's tiles go to its chip and, written, back
    /// as the cluster's write-back policy says, inside the timed run.
    Host,
    /// A device buffer of this worker's chip, as a GPU library's matrix
    /// lives in GPU memory: loaded from a host buffer before each run and
    /// read back after it (each a `copy` task outside the timed part);
    /// every tile task runs on that worker, in place, moving no byte
    /// between host and chip.
    Device(WorkerId),
}

/// [`cholesky`] `runs` times on one matrix buffer, its values written
/// afresh before each run: the first run maps the buffer into each worker
/// and teaches the performance models the kernels' durations (as StarPU's
/// calibration runs do); later runs show the steady state.
///
/// # Errors
/// As [`cholesky`].
pub fn cholesky_runs<T: strata_chip_runtime::kernel::Element>(
    cluster: &Cluster,
    n: u32,
    tile: u32,
    runs: usize,
) -> Result<Vec<JobReport>, Error> {
    cholesky_runs_in::<T>(cluster, n, tile, runs, MatrixHome::Host)
}

/// [`cholesky_runs`] with the matrix where `home` says. Each report's
/// wall time and summary cover the tile tasks only.
///
/// # Errors
/// As [`cholesky`]; a device buffer the worker cannot allocate.
pub fn cholesky_runs_in<T: strata_chip_runtime::kernel::Element>(
    cluster: &Cluster,
    n: u32,
    tile: u32,
    runs: usize,
    home: MatrixHome,
) -> Result<Vec<JobReport>, Error> {
    let job = |why: String| Error::Submit(crate::SubmitError::Job(why));
    if tile == 0 || n % tile != 0 {
        return Err(job(format!("{n} is not a multiple of the tile {tile}")));
    }
    if !matches!(T::DTYPE, DType::F32 | DType::F64) {
        return Err(job(format!(
            "the Cholesky job runs in F32 or F64, not {}",
            T::DTYPE
        )));
    }
    let host = cholesky_matrix::<T>(n);
    // The matrix, or for a device home where it is loaded from and read
    // back into.
    let staging = cluster.buffer_from_slice(&host)?;
    let elem = u64::from(T::DTYPE.bits() / 8);
    let device = match home {
        MatrixHome::Host => None,
        MatrixHome::Device(w) => {
            Some(cluster.device_buffer(w, u64::from(n) * u64::from(n) * elem)?)
        }
    };
    let a = device.as_ref().unwrap_or(&staging);
    // One copy task of the whole matrix, waited for.
    let copy = |from: &crate::Buffer, to: &crate::Buffer| -> Result<(), Error> {
        cluster.submit(
            Task::new("copy")
                .input(&from.tensor(&[n, n], T::DTYPE)?)
                .output(&to.tensor(&[n, n], T::DTYPE)?),
        )?;
        cluster.wait_all().map(|_| ())
    };
    let tiles = n / tile;
    // Tile (i, j) and its transpose, as views of the row-major matrix.
    let offset =
        |i: u32, j: u32| (u64::from(i) * u64::from(n) + u64::from(j)) * u64::from(tile) * elem;
    let t = |i: u32, j: u32| a.view(offset(i, j), &[tile, tile], &[n, 1], T::DTYPE);
    let tt = |i: u32, j: u32| a.view(offset(i, j), &[tile, tile], &[1, n], T::DTYPE);
    // Each tile call's flops (the usual counts), declared for the models.
    let b3 = u64::from(tile).pow(3);
    let mut reports = Vec::with_capacity(runs);
    for run in 0..runs {
        if run > 0 {
            staging.write_slice(0, &host)?;
        }
        if let Some(d) = &device {
            copy(&staging, d)?;
        }
        let start = Instant::now();
        let mut tasks = 0u64;
        for k in 0..tiles {
            cluster.submit(Task::new("potrf").inout(&t(k, k)?).flops(b3 / 3))?;
            for i in k + 1..tiles {
                cluster.submit(
                    Task::new("trsm")
                        .input(&t(k, k)?)
                        .inout(&t(i, k)?)
                        .flops(b3),
                )?;
            }
            for i in k + 1..tiles {
                cluster.submit(
                    Task::new("syrk")
                        .input(&t(i, k)?)
                        .inout(&t(i, i)?)
                        .flops(b3),
                )?;
                for j in k + 1..i {
                    cluster.submit(
                        Task::new("gemm")
                            .input(&t(i, k)?)
                            .input(&tt(j, k)?)
                            .inout(&t(i, j)?)
                            .scalar_f64(-1.0)
                            .scalar_f64(1.0)
                            .flops(2 * b3),
                    )?;
                }
            }
            // potrf, a trsm and a syrk per tile below, a gemm per pair.
            let below = u64::from(tiles - k - 1);
            tasks += 1 + 2 * below + below * below.saturating_sub(1) / 2;
        }
        let summary = cluster.wait_all()?;
        let wall = start.elapsed();
        if let Some(d) = &device {
            copy(d, &staging)?;
        }
        let l = staging.to_vec::<T>()?;
        reports.push(JobReport {
            tasks,
            wall,
            max_abs_err: cholesky_residual(n, &l),
            summary,
        });
    }
    Ok(reports)
}

/// `‖L·Lᵀ·x − A·x‖∞ / ‖A·x‖∞` for a fixed random `x`, with `L` the lower
/// triangle of the row-major `factor`.
///
/// O(n²), on every core: each thread takes a band of rows (the check of
/// an n = 32768 factor is 1.6·10⁹ multiply-adds, seconds on one core).
fn cholesky_residual<T: strata_chip_runtime::kernel::Element>(n: u32, factor: &[T]) -> f64 {
    let size = n as usize;
    let x: Vec<f64> = random_values(7, size).into_iter().map(f64::from).collect();
    let l = |i: usize, j: usize| factor[i * size + j].to_f64();
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    // Row bands of about equal work (row i of the triangle holds i + 1).
    let bands: Vec<std::ops::Range<usize>> = {
        let total = size * (size + 1) / 2;
        let mut out = Vec::with_capacity(threads);
        let (mut from, mut done) = (0, 0);
        for i in 0..size {
            done += i + 1;
            if done * threads >= total * (out.len() + 1) || i + 1 == size {
                out.push(from..i + 1);
                from = i + 1;
            }
        }
        out
    };
    // y = Lᵀ·x: each band adds its rows' part.
    let y: Vec<f64> = std::thread::scope(|s| {
        let parts: Vec<_> = bands
            .iter()
            .map(|rows| {
                let (rows, x, l) = (rows.clone(), &x, &l);
                s.spawn(move || {
                    let mut y = vec![0f64; rows.end];
                    for i in rows {
                        for (j, yj) in y.iter_mut().enumerate().take(i + 1) {
                            *yj += l(i, j) * x[i];
                        }
                    }
                    y
                })
            })
            .collect();
        let mut y = vec![0f64; size];
        for p in parts {
            for (yj, pj) in y.iter_mut().zip(p.join().expect("residual thread")) {
                *yj += pj;
            }
        }
        y
    });
    // z = L·y against A·x, row by row: (worst difference, largest |A·x|).
    let (worst, scale) = std::thread::scope(|s| {
        let parts: Vec<_> = bands
            .iter()
            .map(|rows| {
                let (rows, x, y, l) = (rows.clone(), &x, &y, &l);
                s.spawn(move || {
                    let (mut worst, mut scale) = (0f64, 0f64);
                    for i in rows {
                        let z: f64 = (0..=i).map(|j| l(i, j) * y[j]).sum();
                        let ax: f64 = (0..size)
                            .map(|j| cholesky_matrix_element(n, i, j) * x[j])
                            .sum();
                        worst = worst.max((z - ax).abs());
                        scale = scale.max(ax.abs());
                    }
                    (worst, scale)
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|p| p.join().expect("residual thread"))
            .fold((0f64, 0f64), |(w, s), (pw, ps)| (w.max(pw), s.max(ps)))
    });
    worst / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matrix built on every core is the element function's, row by
    /// row, whatever the split (sizes below, at and above the cores).
    #[test]
    fn the_cholesky_matrix_is_its_element_function() {
        for n in [0u32, 1, 2, 3, 5, 17, 64] {
            let size = n as usize;
            let m = cholesky_matrix::<f64>(n);
            assert_eq!(m.len(), size * size);
            for (k, v) in m.iter().enumerate() {
                assert_eq!(
                    *v,
                    cholesky_matrix_element(n, k / size, k % size),
                    "n {n}, {k}"
                );
            }
        }
    }

    /// The residual is tiny for the true factor (whatever the thread
    /// count splits) and large for one with a single wrong element.
    #[test]
    fn the_cholesky_residual_tells_a_true_factor_from_a_wrong_one() {
        for n in [1u32, 7, 64, 130] {
            let size = n as usize;
            // A plain Cholesky in f64 of the job's matrix.
            let mut l = vec![0f64; size * size];
            for i in 0..size {
                for j in 0..=i {
                    let s: f64 = (0..j).map(|k| l[i * size + k] * l[j * size + k]).sum();
                    let a = cholesky_matrix_element(n, i, j);
                    l[i * size + j] = if i == j {
                        (a - s).sqrt()
                    } else {
                        (a - s) / l[j * size + j]
                    };
                }
            }
            assert!(cholesky_residual(n, &l) < 1e-14, "n = {n}");
            let last = size * size - 1;
            l[last] += 0.5;
            assert!(cholesky_residual(n, &l) > 1e-6, "n = {n}");
            // The upper triangle is not read.
            l[last] -= 0.5;
            if size > 1 {
                l[1] = 1e9;
                assert!(cholesky_residual(n, &l) < 1e-14, "n = {n}");
            }
        }
    }
}
