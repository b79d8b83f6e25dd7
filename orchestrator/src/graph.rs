//! Graph files: a job as JSON (buffers with initial contents, views, tasks,
//! outputs written as `.npy`, optional expectations), checked whole before
//! anything starts, then run on a [`Cluster`]. The format is documented in
//! `docs/graph-format.md`.
//!
//! Every problem is reported with the JSON path of what is wrong, such as
//! `tasks[3].args[1].view: unknown view "c0"`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use strata_chip::kernel::{KernelDescriptor, ScalarKind};
use strata_core::dag::{Arg, NewTask};
use strata_core::{Dag, TaskId};
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, DType, IdentityMint, Tensor,
};

use crate::{Buffer, Cluster, Error, RunSummary, Task, TaskHandle, View, WorkerId};

/// A graph file's problem: where (a JSON path) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {what}")]
pub struct GraphError {
    /// The JSON path, such as `tasks[3].args[1].view`.
    pub path: String,
    /// What is wrong.
    pub what: String,
}

fn err<T>(path: impl Into<String>, what: impl Into<String>) -> Result<T, GraphError> {
    Err(GraphError {
        path: path.into(),
        what: what.into(),
    })
}

/// How a buffer starts.
#[derive(Debug, Clone, PartialEq)]
pub enum Init {
    /// All zero bytes.
    Zeros,
    /// Every element this value.
    Const(f64),
    /// Uniform in `[low, high)` from a seed (integers: whole numbers).
    Random {
        /// Seed.
        seed: u64,
        /// Lower bound.
        low: f64,
        /// Upper bound (exclusive).
        high: f64,
    },
    /// The array of a `.npy` file.
    Npy(PathBuf),
}

/// A buffer of the graph.
#[derive(Debug, Clone)]
pub struct BufferDef {
    /// Its name.
    pub name: String,
    /// Size in bytes.
    pub nbytes: u64,
    /// Element shape and dtype, when given (the buffer is then also a view).
    pub layout: Option<(Vec<u32>, DType)>,
    /// What tasks may do with it.
    pub access: Access,
    /// On this worker's device, or in host memory.
    pub device: Option<u32>,
    /// Initial contents.
    pub init: Init,
}

/// A view of the graph.
#[derive(Debug, Clone)]
pub struct ViewDef {
    /// Its name.
    pub name: String,
    /// Index of its buffer.
    pub buffer: usize,
    /// Byte offset.
    pub byte_offset: u64,
    /// Shape.
    pub shape: Vec<u32>,
    /// Element strides.
    pub strides: Vec<u32>,
    /// Dtype.
    pub dtype: DType,
}

/// A scalar as written.
#[derive(Debug, Clone, PartialEq)]
pub enum ScalarDef {
    /// A plain number, encoded by the callable's scalar kind.
    Number(serde_json::Number),
    /// Explicitly unsigned.
    U64(u64),
    /// Explicitly signed.
    I64(i64),
    /// Explicitly floating point.
    F64(f64),
}

/// A task of the graph.
#[derive(Debug, Clone)]
pub struct TaskDef {
    /// Its JSON path (`tasks[i]`), for messages.
    pub path: String,
    /// Its name, if given.
    pub name: Option<String>,
    /// The callable, `name` or `name@version`.
    pub callable: String,
    /// Views (indices) and tags.
    pub args: Vec<(usize, ArgTag)>,
    /// Scalars.
    pub scalars: Vec<ScalarDef>,
    /// Worker index, if placed.
    pub worker: Option<u32>,
    /// Earlier tasks (indices) it runs after.
    pub after: Vec<usize>,
}

/// What an output must hold.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// Every element equals this value.
    Const(f64),
    /// These values, row-major.
    Values(Vec<f64>),
    /// The array of this `.npy` file.
    Npy(PathBuf),
}

/// An output of the graph.
#[derive(Debug, Clone)]
pub struct OutputDef {
    /// Its JSON path (`outputs[i]`).
    pub path: String,
    /// The view (index) to write.
    pub view: usize,
    /// Where.
    pub npy: PathBuf,
    /// What it must hold, within `tolerance`.
    pub expect: Option<(Expect, f64)>,
}

/// A parsed, checked graph.
#[derive(Debug, Clone)]
pub struct Graph {
    /// Buffers, in file order.
    pub buffers: Vec<BufferDef>,
    /// Views: first one per buffer with a layout (named as the buffer),
    /// then the `views` section.
    pub views: Vec<ViewDef>,
    /// Tasks, in submission order.
    pub tasks: Vec<TaskDef>,
    /// Outputs.
    pub outputs: Vec<OutputDef>,
}

fn object<'a>(
    v: &'a Value,
    path: &str,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, GraphError> {
    let Some(o) = v.as_object() else {
        return err(path, format!("expected an object, found {}", kind(v)));
    };
    for k in o.keys() {
        if !allowed.contains(&k.as_str()) {
            return err(
                join(path, k),
                format!("unknown field; expected one of {}", allowed.join(", ")),
            );
        }
    }
    Ok(o)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn u64_of(v: &Value, path: &str) -> Result<u64, GraphError> {
    v.as_u64().map_or_else(
        || err(path, format!("expected a whole number ≥ 0, found {v}")),
        Ok,
    )
}

fn u32_of(v: &Value, path: &str) -> Result<u32, GraphError> {
    let n = u64_of(v, path)?;
    u32::try_from(n).or_else(|_| err(path, format!("{n} does not fit 32 bits")))
}

fn f64_of(v: &Value, path: &str) -> Result<f64, GraphError> {
    v.as_f64()
        .map_or_else(|| err(path, format!("expected a number, found {v}")), Ok)
}

fn str_of<'a>(v: &'a Value, path: &str) -> Result<&'a str, GraphError> {
    v.as_str().map_or_else(
        || err(path, format!("expected a string, found {}", kind(v))),
        Ok,
    )
}

fn dims_of(v: &Value, path: &str) -> Result<Vec<u32>, GraphError> {
    let Some(a) = v.as_array() else {
        return err(
            path,
            format!("expected an array of whole numbers, found {}", kind(v)),
        );
    };
    if a.is_empty() || a.len() > strata_wire::MAX_DIMS {
        return err(
            path,
            format!("{} dimensions; 1 to {}", a.len(), strata_wire::MAX_DIMS),
        );
    }
    a.iter()
        .enumerate()
        .map(|(i, d)| u32_of(d, &format!("{path}[{i}]")))
        .collect()
}

fn dtype_of(v: &Value, path: &str) -> Result<DType, GraphError> {
    let s = str_of(v, path)?;
    DType::from_name(s).map_or_else(
        || {
            err(
                path,
                format!(
                    "unknown dtype {s:?}; one of {}",
                    DType::ALL.map(DType::name).join(", ")
                ),
            )
        },
        Ok,
    )
}

/// Shape and dtype of a `.npy` file, from its header.
fn npy_layout(file: &Path, path: &str) -> Result<(Vec<u32>, DType), GraphError> {
    let f = std::fs::File::open(file).or_else(|e| err(path, format!("{}: {e}", file.display())))?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(f))
        .or_else(|e| err(path, format!("{}: not a .npy file: {e}", file.display())))?;
    let ts = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => {
            return err(
                path,
                format!("{}: structured dtype {other:?}", file.display()),
            );
        }
    };
    let dtype = crate::npy::dtype_of(&ts).map_or_else(
        || {
            err(
                path,
                format!("{}: dtype {ts:?} is not supported", file.display()),
            )
        },
        Ok,
    )?;
    if npy.order() != npyz::Order::C {
        return err(
            path,
            format!(
                "{}: Fortran-order arrays are not supported; save with C order",
                file.display()
            ),
        );
    }
    let shape: Vec<u32> = match npy.shape() {
        [] => vec![1],
        s => s
            .iter()
            .map(|&d| u32::try_from(d).unwrap_or(u32::MAX))
            .collect(),
    };
    Ok((shape, dtype))
}

impl Graph {
    /// Reads and checks the graph file at `path` (relative paths inside it
    /// are relative to its folder).
    ///
    /// # Errors
    /// The first problem, with its JSON path (`$` for the file itself).
    pub fn load(path: &Path) -> Result<Graph, GraphError> {
        Graph::load_with(path, None)
    }

    /// As [`Graph::load`], writing outputs with relative paths under
    /// `out_dir` instead of the graph's folder.
    ///
    /// # Errors
    /// As [`Graph::load`].
    pub fn load_with(path: &Path, out_dir: Option<&Path>) -> Result<Graph, GraphError> {
        let text = std::fs::read_to_string(path)
            .or_else(|e| err("$", format!("{}: {e}", path.display())))?;
        let json: Value = serde_json::from_str(&text)
            .or_else(|e| err("$", format!("{}: not JSON: {e}", path.display())))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Graph::from_json(&json, &dir, out_dir.unwrap_or(&dir))
    }

    /// Checks a graph given as JSON; relative input file names are
    /// relative to `dir`, relative output file names to `out_dir`.
    ///
    /// # Errors
    /// The first problem, with its JSON path.
    pub fn from_json(json: &Value, dir: &Path, out_dir: &Path) -> Result<Graph, GraphError> {
        let top = object(
            json,
            "",
            &["buffers", "views", "tasks", "outputs", "comment"],
        )?;
        let mut g = Graph {
            buffers: Vec::new(),
            views: Vec::new(),
            tasks: Vec::new(),
            outputs: Vec::new(),
        };
        let mut view_names: HashMap<String, usize> = HashMap::new();
        let empty = Map::new();
        let buffers = match top.get("buffers") {
            Some(b) => object(b, "buffers", &[]).or_else(|_| {
                b.as_object()
                    .map_or_else(|| err("buffers", "expected an object of named buffers"), Ok)
            })?,
            None => return err("buffers", "missing: a graph needs at least one buffer"),
        };
        let _ = &empty;
        if buffers.is_empty() {
            return err("buffers", "empty: a graph needs at least one buffer");
        }
        for (name, b) in buffers {
            let path = format!("buffers.{name}");
            let def = buffer_def(name, b, &path, dir)?;
            if let Some((shape, dtype)) = &def.layout {
                view_names.insert(name.clone(), g.views.len());
                g.views.push(ViewDef {
                    name: name.clone(),
                    buffer: g.buffers.len(),
                    byte_offset: 0,
                    shape: shape.clone(),
                    strides: row_major(shape),
                    dtype: *dtype,
                });
            }
            g.buffers.push(def);
        }
        let buffer_names: HashMap<&str, usize> = g
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| (b.name.as_str(), i))
            .collect();
        if let Some(views) = top.get("views") {
            let Some(views) = views.as_object() else {
                return err("views", "expected an object of named views");
            };
            for (name, v) in views {
                let path = format!("views.{name}");
                if view_names.contains_key(name) {
                    return err(
                        path,
                        format!("the name {name:?} is taken (buffers with a shape are views too)"),
                    );
                }
                let o = object(
                    v,
                    &path,
                    &[
                        "buffer",
                        "shape",
                        "strides",
                        "dtype",
                        "offset",
                        "byte_offset",
                    ],
                )?;
                let bname = str_of(
                    o.get("buffer").map_or(&Value::Null, |x| x),
                    &join(&path, "buffer"),
                )?;
                let &bi = buffer_names.get(bname).map_or_else(
                    || err(join(&path, "buffer"), format!("unknown buffer {bname:?}")),
                    Ok,
                )?;
                let buf = &g.buffers[bi];
                let dtype = match o.get("dtype") {
                    Some(d) => dtype_of(d, &join(&path, "dtype"))?,
                    None => match &buf.layout {
                        Some((_, d)) => *d,
                        None => DType::U8,
                    },
                };
                let shape = match o.get("shape") {
                    Some(s) => dims_of(s, &join(&path, "shape"))?,
                    None => return err(join(&path, "shape"), "missing"),
                };
                let strides = match o.get("strides") {
                    Some(s) => {
                        let st = dims_of(s, &join(&path, "strides"))?;
                        if st.len() != shape.len() {
                            return err(
                                join(&path, "strides"),
                                format!("{} strides for {} dimensions", st.len(), shape.len()),
                            );
                        }
                        st
                    }
                    None => row_major(&shape),
                };
                let byte_offset = match (o.get("offset"), o.get("byte_offset")) {
                    (Some(_), Some(_)) => {
                        return err(path, "give offset (elements) or byte_offset, not both");
                    }
                    (Some(e), None) => {
                        let e = u64_of(e, &join(&path, "offset"))?;
                        if dtype.bits() == 4 && e % 2 == 1 {
                            return err(
                                join(&path, "offset"),
                                format!(
                                    "{} packs two elements per byte: a view starts on an even element",
                                    dtype.name()
                                ),
                            );
                        }
                        dtype
                            .bytes_for(e)
                            .map_or_else(|| err(join(&path, "offset"), "overflows"), Ok)?
                    }
                    (None, Some(b)) => u64_of(b, &join(&path, "byte_offset"))?,
                    (None, None) => 0,
                };
                view_names.insert(name.clone(), g.views.len());
                g.views.push(ViewDef {
                    name: name.clone(),
                    buffer: bi,
                    byte_offset,
                    shape,
                    strides,
                    dtype,
                });
            }
        }
        // Every view must fit its buffer, as the wire format says.
        let probe = Probe::new(&g);
        for (vi, v) in g.views.iter().enumerate() {
            probe.tensor(&g, vi).map_err(|what| GraphError {
                path: if g
                    .buffers
                    .get(v.buffer)
                    .is_some_and(|b| b.name == v.name && b.layout.is_some())
                    && v.byte_offset == 0
                    && Some(&v.shape) == g.buffers[v.buffer].layout.as_ref().map(|l| &l.0)
                {
                    format!("buffers.{}", v.name)
                } else {
                    format!("views.{}", v.name)
                },
                what,
            })?;
        }
        let tasks = match top.get("tasks") {
            Some(Value::Array(t)) => t,
            Some(other) => {
                return err("tasks", format!("expected an array, found {}", kind(other)));
            }
            None => return err("tasks", "missing"),
        };
        let mut task_names: HashMap<String, usize> = HashMap::new();
        for (ti, t) in tasks.iter().enumerate() {
            let path = format!("tasks[{ti}]");
            let o = object(
                t,
                &path,
                &["name", "callable", "args", "scalars", "worker", "after"],
            )?;
            let name = match o.get("name") {
                Some(n) => {
                    let n = str_of(n, &join(&path, "name"))?.to_owned();
                    if task_names.insert(n.clone(), ti).is_some() {
                        return err(
                            join(&path, "name"),
                            format!("{n:?} names an earlier task too"),
                        );
                    }
                    Some(n)
                }
                None => None,
            };
            let callable = str_of(
                o.get("callable").map_or(&Value::Null, |x| x),
                &join(&path, "callable"),
            )?
            .to_owned();
            let mut args = Vec::new();
            if let Some(a) = o.get("args") {
                let Some(a) = a.as_array() else {
                    return err(
                        join(&path, "args"),
                        format!("expected an array, found {}", kind(a)),
                    );
                };
                for (ai, arg) in a.iter().enumerate() {
                    let apath = format!("{path}.args[{ai}]");
                    let ao = object(arg, &apath, &["view", "tag"])?;
                    let vname = str_of(
                        ao.get("view").map_or(&Value::Null, |x| x),
                        &join(&apath, "view"),
                    )?;
                    let &vi = view_names.get(vname).map_or_else(
                        || err(join(&apath, "view"), format!("unknown view {vname:?}")),
                        Ok,
                    )?;
                    let tname = str_of(
                        ao.get("tag").map_or(&Value::Null, |x| x),
                        &join(&apath, "tag"),
                    )?;
                    let tag = ArgTag::from_name(tname).map_or_else(
                        || {
                            err(
                                join(&apath, "tag"),
                                format!("unknown tag {tname:?}; one of input, output, inout, output_existing, no_dep"),
                            )
                        },
                        Ok,
                    )?;
                    args.push((vi, tag));
                }
            }
            let mut scalars = Vec::new();
            if let Some(s) = o.get("scalars") {
                let Some(s) = s.as_array() else {
                    return err(
                        join(&path, "scalars"),
                        format!("expected an array, found {}", kind(s)),
                    );
                };
                for (si, sc) in s.iter().enumerate() {
                    scalars.push(scalar_def(sc, &format!("{path}.scalars[{si}]"))?);
                }
            }
            let worker = match o.get("worker") {
                Some(w) => Some(u32_of(w, &join(&path, "worker"))?),
                None => None,
            };
            let mut after = Vec::new();
            if let Some(a) = o.get("after") {
                let Some(a) = a.as_array() else {
                    return err(
                        join(&path, "after"),
                        format!("expected an array, found {}", kind(a)),
                    );
                };
                for (k, x) in a.iter().enumerate() {
                    let p = format!("{path}.after[{k}]");
                    let j = match x {
                        Value::String(n) => *task_names.get(n).map_or_else(
                            || err(&p, format!("no earlier task is named {n:?}")),
                            Ok,
                        )?,
                        Value::Number(_) => {
                            let j = u64_of(x, &p)? as usize;
                            if j >= ti {
                                return err(p, format!("task {j} is not an earlier task"));
                            }
                            j
                        }
                        other => {
                            return err(
                                p,
                                format!("expected a task name or index, found {}", kind(other)),
                            );
                        }
                    };
                    after.push(j);
                }
            }
            g.tasks.push(TaskDef {
                path,
                name,
                callable,
                args,
                scalars,
                worker,
                after,
            });
        }
        if let Some(outs) = top.get("outputs") {
            let Some(outs) = outs.as_array() else {
                return err(
                    "outputs",
                    format!("expected an array, found {}", kind(outs)),
                );
            };
            for (oi, out) in outs.iter().enumerate() {
                let path = format!("outputs[{oi}]");
                let o = object(out, &path, &["view", "npy", "expect", "tolerance"])?;
                let vname = str_of(
                    o.get("view").map_or(&Value::Null, |x| x),
                    &join(&path, "view"),
                )?;
                let &vi = view_names.get(vname).map_or_else(
                    || err(join(&path, "view"), format!("unknown view {vname:?}")),
                    Ok,
                )?;
                let b = &g.buffers[g.views[vi].buffer];
                if let Some(w) = b.device {
                    return err(
                        join(&path, "view"),
                        format!(
                            "{vname:?} is in worker {w}'s device memory; copy it to a host buffer with a copy task"
                        ),
                    );
                }
                if crate::npy::type_str(g.views[vi].dtype).is_none() {
                    return err(
                        join(&path, "view"),
                        format!("{} has no NumPy dtype", g.views[vi].dtype.name()),
                    );
                }
                let npy = out_dir.join(str_of(
                    o.get("npy").map_or(&Value::Null, |x| x),
                    &join(&path, "npy"),
                )?);
                let tolerance = match o.get("tolerance") {
                    Some(t) => f64_of(t, &join(&path, "tolerance"))?,
                    None => 1e-5,
                };
                let expect = match o.get("expect") {
                    None => None,
                    Some(e) => {
                        let ep = join(&path, "expect");
                        let eo = object(e, &ep, &["const", "values", "npy"])?;
                        let ex = match (eo.get("const"), eo.get("values"), eo.get("npy")) {
                            (Some(c), None, None) => Expect::Const(f64_of(c, &join(&ep, "const"))?),
                            (None, Some(Value::Array(vals)), None) => {
                                let n = g.views[vi]
                                    .shape
                                    .iter()
                                    .map(|&d| u64::from(d))
                                    .product::<u64>();
                                if vals.len() as u64 != n {
                                    return err(
                                        join(&ep, "values"),
                                        format!("{} values for a view of {n} elements", vals.len()),
                                    );
                                }
                                Expect::Values(
                                    vals.iter()
                                        .enumerate()
                                        .map(|(i, v)| f64_of(v, &format!("{ep}.values[{i}]")))
                                        .collect::<Result<_, _>>()?,
                                )
                            }
                            (None, None, Some(p)) => {
                                let file = dir.join(str_of(p, &join(&ep, "npy"))?);
                                let (shape, _) = npy_layout(&file, &join(&ep, "npy"))?;
                                if shape != g.views[vi].shape {
                                    return err(
                                        join(&ep, "npy"),
                                        format!(
                                            "shape {shape:?}, but the view is {:?}",
                                            g.views[vi].shape
                                        ),
                                    );
                                }
                                Expect::Npy(file)
                            }
                            _ => {
                                return err(
                                    ep,
                                    "give exactly one of const, values (an array), npy",
                                );
                            }
                        };
                        Some((ex, tolerance))
                    }
                };
                g.outputs.push(OutputDef {
                    path,
                    view: vi,
                    npy,
                    expect,
                });
            }
        }
        g.dry_run()?;
        Ok(g)
    }

    /// The submit-time checks of every task (grants, arguments of a task
    /// sharing bytes where one is written, limits), run on a DAG of this
    /// graph alone, so a bad task is named before anything starts.
    fn dry_run(&self) -> Result<(), GraphError> {
        let probe = Probe::new(self);
        let mut dag = Dag::new();
        for (i, t) in self.tasks.iter().enumerate() {
            let args = t
                .args
                .iter()
                .map(|&(v, tag)| {
                    probe
                        .tensor(self, v)
                        .map(|tensor| Arg { tensor, tag })
                        .map_err(|what| GraphError {
                            path: t.path.clone(),
                            what,
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut device: Option<(usize, u32)> = None;
            for (ai, &(v, _)) in t.args.iter().enumerate() {
                if let Some(w) = self.buffers[self.views[v].buffer].device {
                    match (device, t.worker) {
                        (Some((aj, d)), _) if d != w => {
                            return err(
                                format!("{}.args[{ai}].view", t.path),
                                format!(
                                    "in worker {w}'s device memory, but argument {aj} is in worker {d}'s: a task runs on one worker"
                                ),
                            );
                        }
                        (_, Some(p)) if p != w => {
                            return err(
                                format!("{}.worker", t.path),
                                format!(
                                    "worker {p}, but argument {ai} is in worker {w}'s device memory"
                                ),
                            );
                        }
                        _ => device = Some((ai, w)),
                    }
                }
            }
            let task = NewTask {
                id: TaskId(i as u64 + 1),
                members: vec![args],
                scalars: vec![t.scalars.len()],
                after: t.after.iter().map(|&j| TaskId(j as u64 + 1)).collect(),
            };
            dag.insert(task).map_err(|e| GraphError {
                path: t.path.clone(),
                what: e.reason.to_string(),
            })?;
        }
        Ok(())
    }

    /// Checks every task against the callables' descriptors (`lookup`
    /// gives the descriptor of a callable as the task names it) and
    /// every worker index against `workers`.
    ///
    /// # Errors
    /// The first problem, with its JSON path.
    pub fn check_callables(
        &self,
        workers: usize,
        lookup: &dyn Fn(&str) -> Result<Signature, String>,
    ) -> Result<(), GraphError> {
        let probe = Probe::new(self);
        for b in &self.buffers {
            if let Some(w) = b.device {
                if w as usize >= workers {
                    return err(
                        format!("buffers.{}.device", b.name),
                        format!("worker {w} does not exist; there are {workers}"),
                    );
                }
            }
        }
        for t in &self.tasks {
            if let Some(w) = t.worker {
                if w as usize >= workers {
                    return err(
                        join(&t.path, "worker"),
                        format!("worker {w} does not exist; there are {workers}"),
                    );
                }
            }
            let sig = lookup(&t.callable).map_err(|what| GraphError {
                path: join(&t.path, "callable"),
                what,
            })?;
            if sig.args.len() != t.args.len() {
                return err(
                    join(&t.path, "args"),
                    format!(
                        "{} takes {} tensor arguments, got {}",
                        t.callable,
                        sig.args.len(),
                        t.args.len()
                    ),
                );
            }
            for (ai, (&(_, tag), access)) in t.args.iter().zip(&sig.args).enumerate() {
                let fits = match access {
                    Access::Read => matches!(tag, ArgTag::Input | ArgTag::NoDep),
                    Access::Write => {
                        matches!(tag, ArgTag::Output | ArgTag::OutputExisting | ArgTag::NoDep)
                    }
                    Access::ReadWrite => matches!(tag, ArgTag::InOut | ArgTag::NoDep),
                };
                if !fits {
                    let want = match access {
                        Access::Read => "input",
                        Access::Write => "output or output_existing",
                        Access::ReadWrite => "inout",
                    };
                    return err(
                        format!("{}.args[{ai}].tag", t.path),
                        format!(
                            "{} {} this argument: tag it {want}, not {}",
                            t.callable,
                            match access {
                                Access::Read => "reads",
                                Access::Write => "writes",
                                Access::ReadWrite => "reads and writes",
                            },
                            tag.name().to_ascii_lowercase()
                        ),
                    );
                }
            }
            if sig.scalars.len() != t.scalars.len() {
                return err(
                    join(&t.path, "scalars"),
                    format!(
                        "{} takes {} scalars, got {}",
                        t.callable,
                        sig.scalars.len(),
                        t.scalars.len()
                    ),
                );
            }
            let mut bits = Vec::with_capacity(t.scalars.len());
            for (si, (s, k)) in t.scalars.iter().zip(&sig.scalars).enumerate() {
                bits.push(self.encode_scalar(t, s, *k).map_err(|what| GraphError {
                    path: format!("{}.scalars[{si}]", t.path),
                    what,
                })?);
            }
            if let Some(kernel) = &sig.kernel {
                let args = t
                    .args
                    .iter()
                    .map(|&(v, tag)| probe.tensor(self, v).map(|tensor| (tensor, tag)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|what| GraphError {
                        path: join(&t.path, "args"),
                        what,
                    })?;
                strata_chip::kernel::check_launch(kernel.as_ref(), &args, &bits).map_err(|e| {
                    GraphError {
                        path: t.path.clone(),
                        what: e.to_string(),
                    }
                })?;
            }
        }
        Ok(())
    }

    fn encode_scalar(&self, t: &TaskDef, s: &ScalarDef, kind: ScalarKind) -> Result<u64, String> {
        let n = match s {
            ScalarDef::U64(v) => return Ok(*v),
            ScalarDef::I64(v) => return Ok(*v as u64),
            ScalarDef::F64(v) => return Ok(v.to_bits()),
            ScalarDef::Number(n) => n,
        };
        let as_int = |n: &serde_json::Number| {
            n.as_u64()
                .or_else(|| n.as_i64().map(|v| v as u64))
                .ok_or_else(|| format!("{n} is not a whole number"))
        };
        match kind {
            ScalarKind::U64 => n
                .as_u64()
                .ok_or_else(|| format!("{n} is not a whole number ≥ 0")),
            ScalarKind::I64 => as_int(n),
            ScalarKind::F64 => n
                .as_f64()
                .map(f64::to_bits)
                .ok_or_else(|| format!("{n} is not a number")),
            ScalarKind::LikeArg(i) => {
                let dtype = t
                    .args
                    .get(i)
                    .map(|&(v, _)| self.views[v].dtype)
                    .ok_or_else(|| {
                        format!("typed like argument {i}, which the task does not have")
                    })?;
                if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
                    n.as_f64()
                        .map(f64::to_bits)
                        .ok_or_else(|| format!("{n} is not a number"))
                } else {
                    as_int(n).map_err(|e| format!("{e} (argument {i} is {})", dtype.name()))
                }
            }
        }
    }
}

/// What a task must match of its callable.
#[derive(Clone)]
pub struct Signature {
    /// Per tensor argument, how the kernel uses it.
    pub args: Vec<Access>,
    /// Per scalar, its kind.
    pub scalars: Vec<ScalarKind>,
    /// The kernel itself, when it is known here (the built-ins of local
    /// workers): then every launch is checked before anything starts,
    /// shapes included.
    pub kernel: Option<std::sync::Arc<dyn strata_chip::Kernel>>,
}

impl std::fmt::Debug for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signature")
            .field("args", &self.args)
            .field("scalars", &self.scalars)
            .field(
                "kernel",
                &self
                    .kernel
                    .as_ref()
                    .map(|k| k.descriptor().qualified_name()),
            )
            .finish()
    }
}

impl Signature {
    /// From a kernel descriptor.
    pub fn of(d: &KernelDescriptor) -> Self {
        Signature {
            args: d.args.iter().map(|a| a.access).collect(),
            scalars: d.scalars.iter().map(|s| s.kind).collect(),
            kernel: None,
        }
    }

    /// From a kernel, whose launches can then be checked here.
    pub fn of_kernel(k: std::sync::Arc<dyn strata_chip::Kernel>) -> Self {
        Signature {
            kernel: Some(std::sync::Arc::clone(&k)),
            ..Signature::of(k.descriptor())
        }
    }

    /// From a canonical descriptor string
    /// (`name@v(a:R:dtypes:rank,…;s:kind,…)`), as workers report it.
    ///
    /// # Errors
    /// A string not of that form.
    pub fn parse(canonical: &str) -> Result<Self, String> {
        let bad = || format!("malformed callable signature {canonical:?}");
        let open = canonical.find('(').ok_or_else(bad)?;
        let inner = canonical[open + 1..].strip_suffix(')').ok_or_else(bad)?;
        let (args, scalars) = inner.split_once(';').ok_or_else(bad)?;
        let args = args
            .split(',')
            .filter(|a| !a.is_empty())
            .map(|a| match a.split(':').nth(1) {
                Some("R") => Ok(Access::Read),
                Some("W") => Ok(Access::Write),
                Some("RW") => Ok(Access::ReadWrite),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?;
        let scalars = scalars
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| match s.rsplit(':').next() {
                Some("u64") => Ok(ScalarKind::U64),
                Some("i64") => Ok(ScalarKind::I64),
                Some("f64") => Ok(ScalarKind::F64),
                Some(k) => k
                    .strip_prefix("like")
                    .and_then(|i| i.parse().ok())
                    .map(ScalarKind::LikeArg)
                    .ok_or_else(bad),
                None => Err(bad()),
            })
            .collect::<Result<_, _>>()?;
        Ok(Signature {
            args,
            scalars,
            kernel: None,
        })
    }
}

fn row_major(shape: &[u32]) -> Vec<u32> {
    let mut st = vec![1u32; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1].saturating_mul(shape[i + 1]);
    }
    st
}

fn scalar_def(v: &Value, path: &str) -> Result<ScalarDef, GraphError> {
    match v {
        Value::Number(n) => Ok(ScalarDef::Number(n.clone())),
        Value::Object(o) if o.len() == 1 => {
            let (k, x) = o.iter().next().map_or_else(|| err(path, "empty"), Ok)?;
            let p = join(path, k);
            match k.as_str() {
                "u64" => Ok(ScalarDef::U64(u64_of(x, &p)?)),
                "i64" => x
                    .as_i64()
                    .map(ScalarDef::I64)
                    .map_or_else(|| err(p, format!("expected a whole number, found {x}")), Ok),
                "f64" => Ok(ScalarDef::F64(f64_of(x, &p)?)),
                _ => err(p, "unknown scalar type; one of u64, i64, f64"),
            }
        }
        other => err(
            path,
            format!(
                "expected a number or {{\"u64\"|\"i64\"|\"f64\": number}}, found {}",
                kind(other)
            ),
        ),
    }
}

fn buffer_def(name: &str, b: &Value, path: &str, dir: &Path) -> Result<BufferDef, GraphError> {
    let o = object(
        b,
        path,
        &["shape", "dtype", "size", "init", "access", "device"],
    )?;
    let init = match o.get("init") {
        None => Init::Zeros,
        Some(Value::String(s)) if s == "zeros" => Init::Zeros,
        Some(Value::String(s)) => {
            return err(
                join(path, "init"),
                format!(
                    "unknown init {s:?}: \"zeros\", or an object with exactly one of const, random, npy"
                ),
            );
        }
        Some(i) => {
            let ip = join(path, "init");
            let io = object(i, &ip, &["const", "random", "npy"])?;
            match (io.get("const"), io.get("random"), io.get("npy")) {
                (Some(c), None, None) => Init::Const(f64_of(c, &join(&ip, "const"))?),
                (None, Some(r), None) => {
                    let rp = join(&ip, "random");
                    let ro = object(r, &rp, &["seed", "low", "high"])?;
                    let seed = match ro.get("seed") {
                        Some(s) => u64_of(s, &join(&rp, "seed"))?,
                        None => 0,
                    };
                    let low = ro
                        .get("low")
                        .map(|v| f64_of(v, &join(&rp, "low")))
                        .transpose()?
                        .unwrap_or(-1.0);
                    let high = ro
                        .get("high")
                        .map(|v| f64_of(v, &join(&rp, "high")))
                        .transpose()?
                        .unwrap_or(1.0);
                    if low >= high {
                        return err(rp, format!("low {low} is not below high {high}"));
                    }
                    Init::Random { seed, low, high }
                }
                (None, None, Some(p)) => Init::Npy(dir.join(str_of(p, &join(&ip, "npy"))?)),
                _ => {
                    return err(
                        ip,
                        "\"zeros\", or an object with exactly one of const, random, npy",
                    );
                }
            }
        }
    };
    let access = match o.get("access") {
        None => Access::ReadWrite,
        Some(a) => {
            let s = str_of(a, &join(path, "access"))?;
            match s.to_ascii_lowercase().as_str() {
                "read" => Access::Read,
                "write" => Access::Write,
                "readwrite" => Access::ReadWrite,
                _ => {
                    return err(
                        join(path, "access"),
                        format!("unknown access {s:?}; one of read, write, readwrite"),
                    );
                }
            }
        }
    };
    let device = o
        .get("device")
        .map(|d| u32_of(d, &join(path, "device")))
        .transpose()?;
    let mut layout = match (o.get("shape"), o.get("dtype")) {
        (Some(s), Some(d)) => Some((
            dims_of(s, &join(path, "shape"))?,
            dtype_of(d, &join(path, "dtype"))?,
        )),
        (Some(_), None) => return err(join(path, "dtype"), "missing (a shape needs a dtype)"),
        (None, Some(_)) => return err(join(path, "shape"), "missing (a dtype needs a shape)"),
        (None, None) => None,
    };
    if let Init::Npy(file) = &init {
        let (shape, dtype) = npy_layout(file, &join(path, "init.npy"))?;
        match &layout {
            Some((s, d)) if (s, d) != (&shape, &dtype) => {
                return err(
                    join(path, "init.npy"),
                    format!(
                        "the file holds {shape:?} {}, but the buffer says {s:?} {}",
                        dtype.name(),
                        d.name()
                    ),
                );
            }
            _ => layout = Some((shape, dtype)),
        }
    }
    if matches!(init, Init::Const(_) | Init::Random { .. }) {
        match &layout {
            None => {
                return err(
                    join(path, "init"),
                    "const and random need a shape and dtype",
                );
            }
            Some((_, d)) if d.bits() < 8 || matches!(d, DType::Fp8E4M3Fn | DType::Fp8E8M0) => {
                return err(
                    join(path, "init"),
                    format!("const and random do not support {}", d.name()),
                );
            }
            _ => {}
        }
    }
    let nbytes = match (&layout, o.get("size")) {
        (Some(_), Some(_)) => {
            return err(join(path, "size"), "give size or shape and dtype, not both");
        }
        (Some((shape, dtype)), None) => {
            let elems = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(u64::from(d)));
            elems
                .and_then(|e| dtype.bytes_for(e))
                .map_or_else(|| err(join(path, "shape"), "too large"), Ok)?
        }
        (None, Some(s)) => u64_of(s, &join(path, "size"))?,
        (None, None) => return err(path, "needs shape and dtype, size, or init.npy"),
    };
    if nbytes == 0 {
        return err(path, "a buffer needs at least one byte");
    }
    if device.is_some() && matches!(init, Init::Npy(_)) {
        // Fine: the bytes are copied to the device.
    }
    Ok(BufferDef {
        name: name.to_owned(),
        nbytes,
        layout,
        access,
        device,
        init,
    })
}

/// Stand-in descriptors for checking views and tasks before any buffer
/// exists.
struct Probe {
    descs: Vec<BufferDescriptor>,
}

impl Probe {
    fn new(g: &Graph) -> Self {
        let mint = IdentityMint::new(*b"graphchk");
        let descs = g
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let backing = if b.device.is_some() {
                    Backing::DeviceMalloc {
                        addr: std::num::NonZeroU64::MIN,
                    }
                } else {
                    Backing::Memfd {
                        st_dev: 0,
                        st_ino: i as u64,
                    }
                };
                let space = if b.device.is_some() {
                    AddressSpace::Device
                } else {
                    AddressSpace::Host
                };
                BufferDescriptor::new(
                    mint.mint().expect("identity"),
                    b.nbytes,
                    space,
                    b.access,
                    backing,
                )
                .expect("a valid descriptor")
            })
            .collect();
        Probe { descs }
    }

    fn tensor(&self, g: &Graph, v: usize) -> Result<Tensor, String> {
        let view = &g.views[v];
        Tensor::new(
            self.descs[view.buffer],
            view.byte_offset,
            &view.shape,
            &view.strides,
            view.dtype,
        )
        .map_err(|e| e.to_string())
    }
}

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

/// Deterministic uniform values in `[low, high)` (splitmix64).
fn uniform(seed: u64, n: usize, low: f64, high: f64) -> impl Iterator<Item = f64> {
    let mut rng = strata_wire::check::Rng(seed);
    (0..n).map(move |_| low + (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (high - low))
}

/// `values` encoded as little-endian elements of `dtype` (whole-byte,
/// numeric dtypes).
fn encode(dtype: DType, values: impl Iterator<Item = f64>, integral: bool) -> Vec<u8> {
    use strata_chip::half::{bf16, f16};
    let mut out = Vec::new();
    for v in values {
        let v = if integral && !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            v.floor()
        } else {
            v
        };
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::I8 => out.extend_from_slice(&(v as i8).to_le_bytes()),
            DType::I16 => out.extend_from_slice(&(v as i16).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push(u8::from(v != 0.0)),
            DType::U16 => out.extend_from_slice(&(v as u16).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::U64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
            DType::Fp8E4M3Fn | DType::Fp8E8M0 | DType::Fp4E2M1 => {}
        }
    }
    out
}

/// Little-endian elements of `dtype` as f64.
fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    use strata_chip::half::{bf16, f16};
    let w = ((dtype.bits() / 8) as usize).max(1);
    bytes
        .chunks_exact(w)
        .map(|c| match dtype {
            DType::F32 => f64::from(f32::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::F16 => f16::from_le_bytes(c.try_into().unwrap_or_default()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(c.try_into().unwrap_or_default()).to_f64(),
            DType::I8 => f64::from(c[0] as i8),
            DType::I16 => f64::from(i16::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::I32 => f64::from(i32::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap_or_default()) as f64,
            DType::U16 => f64::from(u16::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::U32 => f64::from(u32::from_le_bytes(c.try_into().unwrap_or_default())),
            DType::U64 => u64::from_le_bytes(c.try_into().unwrap_or_default()) as f64,
            _ => f64::from(c[0]),
        })
        .collect()
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
        let mut buffers: Vec<Buffer> = Vec::with_capacity(self.buffers.len());
        for b in &self.buffers {
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
                (Init::Const(c), Some((shape, dtype))) => {
                    let n = shape.iter().map(|&d| d as usize).product();
                    Some(encode(*dtype, std::iter::repeat_n(*c, n), false))
                }
                (Init::Random { seed, low, high }, Some((shape, dtype))) => {
                    let n = shape.iter().map(|&d| d as usize).product();
                    Some(encode(*dtype, uniform(*seed, n, *low, *high), true))
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
            buffers.push(buf);
        }
        let views: Vec<View> = self
            .views
            .iter()
            .map(|v| buffers[v.buffer].view(v.byte_offset, &v.shape, &v.strides, v.dtype))
            .collect::<Result<_, _>>()?;
        let sigs: HashMap<&str, Signature> = self
            .tasks
            .iter()
            .map(|t| {
                let sig = cluster.callable_signature(&t.callable).and_then(|s| {
                    Signature::parse(&s).map_err(|m| Error::Submit(crate::SubmitError::Job(m)))
                })?;
                Ok((t.callable.as_str(), sig))
            })
            .collect::<Result<_, Error>>()?;
        let handles: std::cell::RefCell<Vec<TaskHandle>> =
            std::cell::RefCell::new(Vec::with_capacity(self.tasks.len()));
        let mut submit_all = || -> Result<RunSummary, Error> {
            let mut handles = handles.borrow_mut();
            for t in &self.tasks {
                let mut task = Task::new(t.callable.clone());
                for &(v, tag) in &t.args {
                    task = task.arg(&views[v], tag);
                }
                let sig = &sigs[t.callable.as_str()];
                for (s, k) in t.scalars.iter().zip(&sig.scalars) {
                    let bits = self.encode_scalar(t, s, *k).map_err(|e| {
                        Error::Submit(crate::SubmitError::Job(format!("{}: {e}", t.path)))
                    })?;
                    task = task.scalar_u64(bits);
                }
                if let Some(w) = t.worker {
                    task = task.on(WorkerId(w));
                }
                for &j in &t.after {
                    task = task.after(handles[j]);
                }
                let h = cluster.submit(task).map_err(|e| match e {
                    Error::Submit(m) => Error::Submit(crate::SubmitError::At {
                        path: t.path.clone(),
                        error: Box::new(m),
                    }),
                    other => other,
                })?;
                handles.push(h);
            }
            cluster.wait_all()
        };
        let summary = around(&mut submit_all).map_err(|e| match e {
            // Name the failed task by its place in the file too.
            Error::Run(mut r) => {
                if let Some(i) = handles.borrow().iter().position(|h| h.id() == r.task) {
                    r.callable = format!("{}, tasks[{i}]", r.callable);
                }
                Error::Run(r)
            }
            other => other,
        })?;
        let mut outputs = Vec::new();
        let mut mismatches = Vec::new();
        for o in &self.outputs {
            let view = &views[o.view];
            if let Some(dir) = o.npy.parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir).map_err(|e| Error::Npy {
                        path: dir.display().to_string(),
                        reason: crate::NpyError::Io(e),
                    })?;
                }
            }
            view.save_npy(&o.npy)?;
            outputs.push(o.npy.clone());
            if let Some((expect, tol)) = &o.expect {
                let got = decode(view.dtype(), &view.read_elements()?);
                let want: Vec<f64> = match expect {
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
                    mismatches.push(format!(
                        "{}: element {i} is {g}, expected {w} (tolerance {tol})",
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
