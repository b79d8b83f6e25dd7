//! Reading a graph file: the JSON into a [`Graph`], every field checked
//! and named by its JSON path when it is wrong.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Map, Value};
use strata_wire::{ArgTag, DType};

use super::check::Probe;
use super::init::{buffer_def, npy_layout};
use super::{Expect, Graph, GraphError, OutputDef, ScalarDef, TaskDef, ViewDef, err};

/// View names to their index in [`Graph::views`].
type Names = HashMap<String, usize>;

/// What the reader knows at a point of the file: the names in sight there.
#[derive(Default)]
struct Walk {
    /// Views in sight: the file's own, and those of the scopes open here.
    views: Names,
    /// Buffers in sight, likewise (index in [`Graph::buffers`]).
    buffers: HashMap<String, usize>,
    /// Names declared in scopes that have ended, with the scope's path.
    gone: HashMap<String, String>,
    /// Named tasks (index in [`Graph::tasks`]).
    tasks: HashMap<String, usize>,
}

impl Walk {
    /// Why `name` is no view here.
    fn unknown(&self, what: &str, name: &str) -> String {
        match self.gone.get(name) {
            Some(scope) => format!(
                "unknown {what} {name:?}: it belongs to the scope at {scope}, which has ended (its memory is reclaimed when the scope ends: use it inside the scope, or copy it to a buffer there)"
            ),
            None => format!("unknown {what} {name:?}"),
        }
    }

    /// Refuses a name already given to a buffer or view anywhere before.
    fn fresh(&self, name: &str, path: &str) -> Result<(), GraphError> {
        if self.views.contains_key(name)
            || self.buffers.contains_key(name)
            || self.gone.contains_key(name)
        {
            return err(
                path,
                format!("the name {name:?} is taken (names are unique across the file)"),
            );
        }
        Ok(())
    }
}

impl Graph {
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
            scopes: Vec::new(),
            steps: Vec::new(),
            outputs: Vec::new(),
        };
        let mut walk = Walk::default();
        buffers(top, dir, &mut g, &mut walk)?;
        named_views(
            top.get("views"),
            "views",
            &mut g,
            &mut walk,
            &mut Vec::new(),
        )?;
        views_fit(&g, 0)?;
        let tasks = match top.get("tasks") {
            Some(t) => t,
            None => return err("tasks", "missing"),
        };
        task_list(tasks, "tasks", &mut g, &mut walk, None)?;
        outputs(top, dir, out_dir, &mut g, &walk)?;
        g.dry_run()?;
        Ok(g)
    }
}

/// The `buffers` section; a buffer with a shape is a view of itself too.
fn buffers(
    top: &Map<String, Value>,
    dir: &Path,
    g: &mut Graph,
    walk: &mut Walk,
) -> Result<(), GraphError> {
    let buffers = match top.get("buffers") {
        Some(b) => object(b, "buffers", &[]).or_else(|_| {
            b.as_object()
                .map_or_else(|| err("buffers", "expected an object of named buffers"), Ok)
        })?,
        None => return err("buffers", "missing: a graph needs at least one buffer"),
    };
    if buffers.is_empty() {
        return err("buffers", "empty: a graph needs at least one buffer");
    }
    for (name, b) in buffers {
        let path = format!("buffers.{name}");
        let def = buffer_def(name, b, &path, dir)?;
        add_buffer(g, walk, def, path);
    }
    Ok(())
}

/// Adds a buffer, and its own view when it has a shape.
fn add_buffer(g: &mut Graph, walk: &mut Walk, def: super::BufferDef, path: String) {
    if let Some((shape, dtype)) = &def.layout {
        walk.views.insert(def.name.clone(), g.views.len());
        g.views.push(ViewDef {
            name: def.name.clone(),
            path,
            buffer: g.buffers.len(),
            byte_offset: 0,
            shape: shape.clone(),
            strides: row_major(shape),
            dtype: *dtype,
        });
    }
    walk.buffers.insert(def.name.clone(), g.buffers.len());
    g.buffers.push(def);
}

/// A `views` section (the file's, at `path` `views`, or a scope's); the
/// names it declares are added to `declared`.
fn named_views(
    views: Option<&Value>,
    path: &str,
    g: &mut Graph,
    walk: &mut Walk,
    declared: &mut Vec<String>,
) -> Result<(), GraphError> {
    let Some(views) = views else {
        return Ok(());
    };
    let Some(views) = views.as_object() else {
        return err(path, "expected an object of named views");
    };
    for (name, v) in views {
        let path = join(path, name);
        if walk.views.contains_key(name) || walk.gone.contains_key(name) {
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
        let &bi = walk.buffers.get(bname).map_or_else(
            || err(join(&path, "buffer"), walk.unknown("buffer", bname)),
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
        walk.views.insert(name.clone(), g.views.len());
        declared.push(name.clone());
        g.views.push(ViewDef {
            name: name.clone(),
            path,
            buffer: bi,
            byte_offset,
            shape,
            strides,
            dtype,
        });
    }
    Ok(())
}

/// Every view from `first` on must fit its buffer, as the wire format
/// says.
fn views_fit(g: &Graph, first: usize) -> Result<(), GraphError> {
    let probe = Probe::new(g);
    for vi in first..g.views.len() {
        probe.tensor(g, vi).map_err(|what| GraphError {
            path: g.views[vi].path.clone(),
            what,
        })?;
    }
    Ok(())
}

/// A `tasks` array at `path` (the file's, or a scope's), inside `scope`:
/// its tasks, and the scopes among them.
fn task_list(
    tasks: &Value,
    path: &str,
    g: &mut Graph,
    walk: &mut Walk,
    scope: Option<usize>,
) -> Result<(), GraphError> {
    let Value::Array(tasks) = tasks else {
        return err(path, format!("expected an array, found {}", kind(tasks)));
    };
    // Each element's task, by its place in this array (`after` indices
    // name tasks of the same array).
    let mut here: Vec<Option<usize>> = Vec::with_capacity(tasks.len());
    for (ti, t) in tasks.iter().enumerate() {
        let path = format!("{path}[{ti}]");
        if t.as_object().is_some_and(|o| o.contains_key("scope")) {
            scope_def(t, &path, g, walk, scope)?;
            here.push(None);
            continue;
        }
        let def = task_def(t, path, walk, &here)?;
        if let Some(n) = &def.name {
            walk.tasks.insert(n.clone(), g.tasks.len());
        }
        here.push(Some(g.tasks.len()));
        g.steps.push(super::Step::Task(g.tasks.len()));
        g.tasks.push(def);
    }
    Ok(())
}

/// A scope: `{"scope": {"alloc": …, "views": …, "tasks": […]}}`. Its
/// allocations and views are in sight inside it only.
fn scope_def(
    t: &Value,
    path: &str,
    g: &mut Graph,
    walk: &mut Walk,
    parent: Option<usize>,
) -> Result<(), GraphError> {
    let o = object(t, path, &["scope"])?;
    let path = join(path, "scope");
    let so = object(
        o.get("scope").map_or(&Value::Null, |x| x),
        &path,
        &["alloc", "views", "tasks", "comment"],
    )?;
    let si = g.scopes.len();
    g.scopes.push(super::ScopeDef {
        path: path.clone(),
        parent,
    });
    g.steps.push(super::Step::Open(si));
    let first_view = g.views.len();
    let mut declared: Vec<String> = Vec::new();
    if let Some(a) = so.get("alloc") {
        let apath = join(&path, "alloc");
        let Some(a) = a.as_object() else {
            return err(
                apath,
                format!("expected an object of named allocations, found {}", kind(a)),
            );
        };
        for (name, def) in a {
            let bpath = join(&apath, name);
            walk.fresh(name, &bpath)?;
            let def = alloc_def(name, def, &bpath, si)?;
            add_buffer(g, walk, def, bpath);
            declared.push(name.clone());
        }
    }
    named_views(
        so.get("views"),
        &join(&path, "views"),
        g,
        walk,
        &mut declared,
    )?;
    views_fit(g, first_view)?;
    let tasks = match so.get("tasks") {
        Some(t) => t,
        None => return err(join(&path, "tasks"), "missing"),
    };
    task_list(tasks, &join(&path, "tasks"), g, walk, Some(si))?;
    g.steps.push(super::Step::End(si));
    for name in declared {
        walk.views.remove(&name);
        walk.buffers.remove(&name);
        walk.gone.insert(name, path.clone());
    }
    Ok(())
}

/// An allocation of a scope: `{"shape": [...], "dtype": "f32"}`, zeroed
/// memory the runtime reclaims when the scope ends.
fn alloc_def(
    name: &str,
    v: &Value,
    path: &str,
    scope: usize,
) -> Result<super::BufferDef, GraphError> {
    let o = object(v, path, &["shape", "dtype"])?;
    let shape = match o.get("shape") {
        Some(s) => dims_of(s, &join(path, "shape"))?,
        None => {
            return err(
                join(path, "shape"),
                "missing (an allocation needs a shape and a dtype)",
            );
        }
    };
    if let Some(i) = shape.iter().position(|&d| d == 0) {
        return err(
            format!("{path}.shape[{i}]"),
            "0: every axis needs at least one element",
        );
    }
    let dtype = match o.get("dtype") {
        Some(d) => dtype_of(d, &join(path, "dtype"))?,
        None => {
            return err(
                join(path, "dtype"),
                "missing (an allocation needs a shape and a dtype)",
            );
        }
    };
    let nbytes = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(u64::from(d)))
        .and_then(|e| dtype.bytes_for(e))
        .map_or_else(
            || {
                err(
                    join(path, "shape"),
                    "too large: its size in bytes overflows 64 bits",
                )
            },
            Ok,
        )?;
    Ok(super::BufferDef {
        name: name.to_owned(),
        nbytes,
        layout: Some((shape, dtype)),
        access: strata_wire::Access::ReadWrite,
        device: None,
        init: super::Init::Zeros,
        scope: Some(scope),
    })
}

/// One task: callable, tagged view arguments, scalars, placement and
/// explicit predecessors (`here` maps this array's earlier elements to
/// their tasks).
fn task_def(
    t: &Value,
    path: String,
    walk: &Walk,
    here: &[Option<usize>],
) -> Result<TaskDef, GraphError> {
    let ti = here.len();
    let o = object(
        t,
        &path,
        &[
            "name", "callable", "args", "scalars", "worker", "after", "timeout",
        ],
    )?;
    let name = match o.get("name") {
        Some(n) => {
            let n = str_of(n, &join(&path, "name"))?.to_owned();
            if walk.tasks.contains_key(&n) {
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
            let &vi = walk.views.get(vname).map_or_else(
                || err(join(&apath, "view"), walk.unknown("view", vname)),
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
                Value::String(n) => *walk
                    .tasks
                    .get(n)
                    .map_or_else(|| err(&p, format!("no earlier task is named {n:?}")), Ok)?,
                Value::Number(_) => {
                    let j = u64_of(x, &p)?;
                    match usize::try_from(j).ok().filter(|&j| j < ti) {
                        None => return err(p, format!("task {j} is not an earlier task")),
                        Some(j) => here[j].map_or_else(
                            || {
                                err(
                                    &p,
                                    format!("element {j} of this array is a scope, not a task: name a task inside it"),
                                )
                            },
                            Ok,
                        )?,
                    }
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
    let timeout = match o.get("timeout") {
        Some(t) => Some(timeout_of(t, &join(&path, "timeout"))?),
        None => None,
    };
    Ok(TaskDef {
        path,
        name,
        callable,
        args,
        scalars,
        worker,
        after,
        timeout,
    })
}

/// The `outputs` section: host views written as `.npy`, with what they
/// must hold.
fn outputs(
    top: &Map<String, Value>,
    dir: &Path,
    out_dir: &Path,
    g: &mut Graph,
    walk: &Walk,
) -> Result<(), GraphError> {
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
            let &vi = walk
                .views
                .get(vname)
                .map_or_else(|| err(join(&path, "view"), walk.unknown("view", vname)), Ok)?;
            let b = &g.buffers[g.views[vi].buffer];
            if let Some(w) = b.device {
                return err(
                    join(&path, "view"),
                    format!(
                        "{vname:?} is in worker {w}'s device memory; copy it to a host buffer with a copy task"
                    ),
                );
            }
            if strata_orchestrator::npy::type_str(g.views[vi].dtype).is_none() {
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
                            // A complex element is two values, real first.
                            let parts = super::init::parts(g.views[vi].dtype) as u64;
                            if vals.len() as u64 != n * parts {
                                let each = if parts == 2 {
                                    " (two per complex element, the real part first)"
                                } else {
                                    ""
                                };
                                return err(
                                    join(&ep, "values"),
                                    format!(
                                        "{} values for a view of {n} elements{each}",
                                        vals.len()
                                    ),
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
                            return err(ep, "give exactly one of const, values (an array), npy");
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
    Ok(())
}

pub(super) fn object<'a>(
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

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn u64_of(v: &Value, path: &str) -> Result<u64, GraphError> {
    v.as_u64().map_or_else(
        || err(path, format!("expected a whole number ≥ 0, found {v}")),
        Ok,
    )
}

pub(super) fn u32_of(v: &Value, path: &str) -> Result<u32, GraphError> {
    let n = u64_of(v, path)?;
    u32::try_from(n).or_else(|_| err(path, format!("{n} does not fit 32 bits")))
}

pub(super) fn f64_of(v: &Value, path: &str) -> Result<f64, GraphError> {
    v.as_f64()
        .map_or_else(|| err(path, format!("expected a number, found {v}")), Ok)
}

/// A task's timeout: a positive, finite number of seconds that a
/// [`Duration`](std::time::Duration) can hold.
pub(super) fn timeout_of(v: &Value, path: &str) -> Result<std::time::Duration, GraphError> {
    let secs = v.as_f64().map_or_else(
        || {
            err(
                path,
                format!("expected a number of seconds, found {}", kind(v)),
            )
        },
        Ok,
    )?;
    if secs <= 0.0 || !secs.is_finite() {
        return err(
            path,
            format!("{v} seconds can never be met; give a positive number of seconds"),
        );
    }
    std::time::Duration::try_from_secs_f64(secs)
        .or_else(|_| err(path, format!("{v} seconds is too long to count")))
}

pub(super) fn str_of<'a>(v: &'a Value, path: &str) -> Result<&'a str, GraphError> {
    v.as_str().map_or_else(
        || err(path, format!("expected a string, found {}", kind(v))),
        Ok,
    )
}

pub(super) fn dims_of(v: &Value, path: &str) -> Result<Vec<u32>, GraphError> {
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

pub(super) fn dtype_of(v: &Value, path: &str) -> Result<DType, GraphError> {
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
