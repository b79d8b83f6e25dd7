//! Reading a graph file: the JSON into a [`Graph`], every field checked
//! and named by its JSON path when it is wrong (the fields by
//! `fields.rs`, the tasks, scopes and the names in sight by `scopes.rs`).

use std::path::Path;

use serde_json::{Map, Value};

use super::fields::{f64_of, join, kind, object, str_of};
use super::init::{buffer_def, npy_layout};
use super::scopes::{Walk, add_buffer, named_views, task_list, views_fit};
use super::{Expect, Graph, GraphError, OutputDef, err};

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
