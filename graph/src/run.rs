//! A checked graph run on a cluster: buffers made and filled, every task
//! submitted through `Cluster::submit` in file order (scopes opened, their
//! buffers allocated, and ended around the tasks inside them), outputs
//! written as `.npy` and checked against their expectations.

use std::collections::HashMap;
use std::path::PathBuf;

use strata_orchestrator::{
    Buffer, Cluster, Error, NpyError, RunSummary, Scope, SubmitError, Task, TaskHandle, View,
    WorkerId,
};

use super::check::Callable;
use super::init::{decode, encode, parts, uniform};
use super::{Expect, Graph, Init, Step};

/// Wraps the submit-and-wait part of [`Graph::run`] (the CLI draws a
/// progress bar around it).
pub type Around<'a> =
    &'a dyn Fn(&mut dyn FnMut() -> Result<RunSummary, Error>) -> Result<RunSummary, Error>;

/// What a graph run did.
#[derive(Debug, Clone)]
pub struct GraphRun {
    /// The run's figures.
    pub summary: RunSummary,
    /// Output files written.
    pub outputs: Vec<PathBuf>,
    /// Outputs whose expectation failed: path and why.
    pub mismatches: Vec<String>,
}

impl Graph {
    /// Creates the buffers on `cluster`, submits every task in order,
    /// waits, writes the outputs and checks their expectations.
    /// `around` wraps the submit-and-wait part (for a progress bar).
    ///
    /// # Errors
    /// A buffer that cannot be made or filled, a refused task (naming its
    /// JSON path), the run's first failure, or an output file.
    pub fn run(&self, cluster: &Cluster, around: Around<'_>) -> Result<GraphRun, Error> {
        let mut buffers: Vec<Option<Buffer>> = Vec::with_capacity(self.buffers.len());
        for b in &self.buffers {
            // A scope's allocations are made when it opens.
            if b.scope.is_some() {
                buffers.push(None);
                continue;
            }
            let buf = match b.device {
                Some(w) => cluster.device_buffer(WorkerId(w), b.nbytes)?,
                None => cluster.buffer_with(b.nbytes, b.access)?,
            };
            let bytes = match (&b.init, &b.layout) {
                (Init::Zeros, _) => {
                    if b.device.is_some() {
                        Some(vec![0u8; usize::try_from(b.nbytes).unwrap_or(usize::MAX)])
                    } else {
                        None
                    }
                }
                // A complex constant is real (imaginary part 0); complex
                // random values draw both parts.
                (Init::Const(c), Some((shape, dtype))) => {
                    let n: usize = shape.iter().map(|&d| d as usize).product();
                    let value = [*c, 0.0];
                    let each = &value[..parts(*dtype)];
                    Some(encode(
                        *dtype,
                        each.iter().copied().cycle().take(n * each.len()),
                        false,
                    ))
                }
                (Init::Random { seed, low, high }, Some((shape, dtype))) => {
                    let n: usize = shape.iter().map(|&d| d as usize).product();
                    Some(encode(
                        *dtype,
                        uniform(*seed, n * parts(*dtype), *low, *high),
                        true,
                    ))
                }
                (Init::Npy(path), _) => {
                    let loaded = cluster.buffer_from_npy(path)?;
                    Some(loaded.buffer().to_bytes()?)
                }
                _ => None,
            };
            if let Some(bytes) = bytes {
                if b.device.is_some() {
                    cluster.write_device(&buf, 0, &bytes)?;
                } else {
                    buf.write_bytes(0, &bytes)?;
                }
            }
            buffers.push(Some(buf));
        }
        let mut views: Vec<Option<View>> = self
            .views
            .iter()
            .map(|v| {
                buffers[v.buffer]
                    .as_ref()
                    .map(|b| b.view(v.byte_offset, &v.shape, &v.strides, v.dtype))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        // Per scope, the buffers it allocates and the views of them.
        let mut allocs: Vec<Vec<usize>> = vec![Vec::new(); self.scopes.len()];
        for (bi, b) in self.buffers.iter().enumerate() {
            if let Some(s) = b.scope {
                allocs[s].push(bi);
            }
        }
        let mut views_of: Vec<Vec<usize>> = vec![Vec::new(); self.buffers.len()];
        for (vi, v) in self.views.iter().enumerate() {
            views_of[v.buffer].push(vi);
        }
        let sigs: HashMap<&str, Callable> = self
            .tasks
            .iter()
            .map(|t| {
                let sig = Callable::of(&cluster.callable_signature(&t.callable)?);
                Ok((t.callable.as_str(), sig))
            })
            .collect::<Result<_, Error>>()?;
        let handles: std::cell::RefCell<Vec<TaskHandle>> =
            std::cell::RefCell::new(Vec::with_capacity(self.tasks.len()));
        let mut submit_all = || -> Result<RunSummary, Error> {
            let mut handles = handles.borrow_mut();
            let mut open: Vec<Option<Scope>> = vec![None; self.scopes.len()];
            for step in &self.steps {
                match *step {
                    Step::Open(s) => {
                        let scope = match self.scopes[s].parent.and_then(|p| open[p]) {
                            Some(parent) => cluster.open_scope_in(parent)?,
                            None => cluster.open_scope()?,
                        };
                        open[s] = Some(scope);
                        for &bi in &allocs[s] {
                            let Some((shape, dtype)) = &self.buffers[bi].layout else {
                                continue;
                            };
                            let made = cluster.alloc_in(scope, shape, *dtype)?;
                            for &vi in &views_of[bi] {
                                let v = &self.views[vi];
                                views[vi] = Some(made.buffer().view(
                                    v.byte_offset,
                                    &v.shape,
                                    &v.strides,
                                    v.dtype,
                                )?);
                            }
                        }
                    }
                    Step::End(s) => {
                        if let Some(scope) = open[s].take() {
                            cluster.end_scope(scope)?;
                        }
                        for &bi in &allocs[s] {
                            for &vi in &views_of[bi] {
                                views[vi] = None;
                            }
                        }
                    }
                    Step::Task(ti) => {
                        let t = &self.tasks[ti];
                        let mut task = Task::new(t.callable.clone());
                        for &(v, tag) in &t.args {
                            let view = views[v].as_ref().ok_or_else(|| {
                                Error::Submit(SubmitError::Job(format!(
                                    "{}: view {:?} is not in sight here",
                                    t.path, self.views[v].name
                                )))
                            })?;
                            task = task.arg(view, tag);
                        }
                        let sig = &sigs[t.callable.as_str()];
                        for (s, k) in t.scalars.iter().zip(&sig.signature.scalars) {
                            let bits = self.encode_scalar(t, s, k.kind).map_err(|e| {
                                Error::Submit(SubmitError::Job(format!("{}: {e}", t.path)))
                            })?;
                            task = task.scalar_u64(bits);
                        }
                        if let Some(w) = t.worker {
                            task = task.on(WorkerId(w));
                        }
                        for &j in &t.after {
                            task = task.after(handles[j]);
                        }
                        if let Some(timeout) = t.timeout {
                            task = task.timeout(timeout);
                        }
                        let h = cluster.submit(task).map_err(|e| match e {
                            Error::Submit(m) => Error::Submit(SubmitError::At {
                                path: t.path.clone(),
                                error: Box::new(m),
                            }),
                            other => other,
                        })?;
                        handles.push(h);
                    }
                }
            }
            cluster.wait_all()
        };
        let summary = around(&mut submit_all).map_err(|e| match e {
            // Name the failed task by its place in the file too.
            Error::Run(mut r) => {
                if let Some(i) = handles.borrow().iter().position(|h| h.id() == r.task) {
                    r.callable = format!("{}, {}", r.callable, self.tasks[i].path);
                }
                Error::Run(r)
            }
            other => other,
        })?;
        let mut outputs = Vec::new();
        let mut mismatches = Vec::new();
        for o in &self.outputs {
            // Outputs name views of the file's own buffers (checked when
            // the graph was read), which live through the run.
            let view = views[o.view].as_ref().ok_or_else(|| {
                Error::Submit(SubmitError::Job(format!(
                    "{}: view {:?} is not in sight after the run",
                    o.path, self.views[o.view].name
                )))
            })?;
            if let Some(dir) = o.npy.parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(|e| Error::Npy {
                        path: dir.display().to_string(),
                        reason: NpyError::Io(e),
                    })?;
                }
            }
            view.save_npy(&o.npy)?;
            outputs.push(o.npy.clone());
            if let Some((expect, tol)) = &o.expect {
                let got = decode(view.dtype(), &view.read_elements()?);
                let want: Vec<f64> = match expect {
                    // Complex outputs compare part by part: a constant is
                    // real, its imaginary parts 0.
                    Expect::Const(c) if view.dtype().is_complex() => (0..got.len())
                        .map(|i| if i % 2 == 0 { *c } else { 0.0 })
                        .collect(),
                    Expect::Const(c) => vec![*c; got.len()],
                    Expect::Values(v) => v.clone(),
                    Expect::Npy(p) => {
                        let e = cluster.buffer_from_npy(p)?;
                        decode(e.dtype(), &e.read_elements()?)
                    }
                };
                let bad = |g: f64, w: f64| {
                    let d = (g - w).abs();
                    !(g == w || d <= *tol)
                };
                // The first NaN mismatch, else the largest difference.
                let worst = got
                    .iter()
                    .zip(&want)
                    .enumerate()
                    .filter(|(_, (g, w))| bad(**g, **w))
                    .max_by(|a, b| {
                        let da = (a.1.0 - a.1.1).abs();
                        let db = (b.1.0 - b.1.1).abs();
                        match (da.is_nan(), db.is_nan()) {
                            (true, true) => b.0.cmp(&a.0),
                            (true, false) => std::cmp::Ordering::Greater,
                            (false, true) => std::cmp::Ordering::Less,
                            (false, false) => da.total_cmp(&db).then(b.0.cmp(&a.0)),
                        }
                    });
                if got.len() != want.len() {
                    mismatches.push(format!(
                        "{}: {} elements, expected {}",
                        o.path,
                        got.len(),
                        want.len()
                    ));
                } else if let Some((i, (g, w))) = worst {
                    let at = if view.dtype().is_complex() {
                        let part = if i % 2 == 0 { "real" } else { "imaginary" };
                        format!("element {}'s {part} part", i / 2)
                    } else {
                        format!("element {i}")
                    };
                    mismatches.push(format!(
                        "{}: {at} is {g}, expected {w} (tolerance {tol})",
                        o.path
                    ));
                }
            }
        }
        Ok(GraphRun {
            summary,
            outputs,
            mismatches,
        })
    }
}
