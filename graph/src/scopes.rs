//! The names in sight at each point of a graph file, and the `tasks`
//! arrays that use them: tasks, and scopes with their allocations and
//! views, which are in sight inside their scope only.

use std::collections::HashMap;

use serde_json::Value;
use strata_wire::{ArgTag, DType};

use super::check::Probe;
use super::fields::{
    dims_of, dtype_of, join, kind, object, row_major, scalar_def, str_of, timeout_of, u32_of,
    u64_of,
};
use super::{BufferDef, Graph, GraphError, ScopeDef, Step, TaskDef, ViewDef, err};

/// View names to their index in [`Graph::views`].
pub(super) type Names = HashMap<String, usize>;

/// What the reader knows at a point of the file: the names in sight there.
#[derive(Default)]
pub(super) struct Walk {
    /// Views in sight: the file's own, and those of the scopes open here.
    pub(super) views: Names,
    /// Buffers in sight, likewise (index in [`Graph::buffers`]).
    buffers: HashMap<String, usize>,
    /// Names declared in scopes that have ended, with the scope's path.
    gone: HashMap<String, String>,
    /// Named tasks (index in [`Graph::tasks`]).
    tasks: HashMap<String, usize>,
}

impl Walk {
    /// Why `name` is no view here.
    pub(super) fn unknown(&self, what: &str, name: &str) -> String {
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

/// Adds a buffer, and its own view when it has a shape.
pub(super) fn add_buffer(g: &mut Graph, walk: &mut Walk, def: BufferDef, path: String) {
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
pub(super) fn named_views(
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
pub(super) fn views_fit(g: &Graph, first: usize) -> Result<(), GraphError> {
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
pub(super) fn task_list(
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
        g.steps.push(Step::Task(g.tasks.len()));
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
    g.scopes.push(ScopeDef {
        path: path.clone(),
        parent,
    });
    g.steps.push(Step::Open(si));
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
    g.steps.push(Step::End(si));
    for name in declared {
        walk.views.remove(&name);
        walk.buffers.remove(&name);
        walk.gone.insert(name, path.clone());
    }
    Ok(())
}

/// An allocation of a scope: `{"shape": [...], "dtype": "f32"}`, zeroed
/// memory the runtime reclaims when the scope ends.
fn alloc_def(name: &str, v: &Value, path: &str, scope: usize) -> Result<BufferDef, GraphError> {
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
    Ok(BufferDef {
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
