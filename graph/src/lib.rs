//! `strata-graph`: graph files, a job as JSON (buffers with initial contents, views, tasks,
//! outputs written as `.npy`, optional expectations), checked whole before
//! anything starts, then run on a [`Cluster`](strata_orchestrator::Cluster). The format is documented in
//! `docs/graph-format.md`.
//!
//! Every problem is reported with the JSON path of what is wrong, such as
//! `tasks[3].args[1].view: unknown view "c0"`.

//!
//! The folder follows a graph's life: [`parse`] reads the JSON into a
//! [`Graph`] (every field checked, views fitted to their buffers, tasks
//! and scopes with the names in sight at each point),
//! [`check`] runs the submit-time checks of every task before anything
//! starts (and, given the callables' signatures, every launch), `init`
//! fills the buffers, and [`run`] submits the tasks through the same
//! `Cluster::submit` a Rust driver uses, then writes and checks the
//! outputs.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use strata_wire::{Access, ArgTag, DType};

pub mod check;
mod fields;
mod init;
pub mod parse;
pub mod run;
mod scopes;

pub use check::Callable;
pub use run::{Around, GraphRun};

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
    /// For a buffer a scope allocates (`alloc`), that scope (an index in
    /// [`Graph::scopes`]): it is made when the scope opens and reclaimed
    /// when it ends.
    pub scope: Option<usize>,
}

/// A view of the graph.
#[derive(Debug, Clone)]
pub struct ViewDef {
    /// Its name.
    pub name: String,
    /// Its JSON path (`views.v`, `buffers.a` for a shaped buffer's own
    /// view, `tasks[1].scope.alloc.t`), for messages.
    pub path: String,
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
    /// Its JSON path (`tasks[i]`, `tasks[1].scope.tasks[0]` inside a
    /// scope), for messages.
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
    /// Earlier tasks (indices in [`Graph::tasks`]) it runs after.
    pub after: Vec<usize>,
    /// How long it may run once sent to its worker (`timeout`, seconds).
    pub timeout: Option<std::time::Duration>,
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

/// A scope of the graph: a `{"scope": …}` element of a `tasks` array.
#[derive(Debug, Clone)]
pub struct ScopeDef {
    /// Its JSON path (`tasks[1].scope`).
    pub path: String,
    /// The scope it is inside, if any (an index in [`Graph::scopes`]).
    pub parent: Option<usize>,
}

/// One step of a graph's run, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Open a scope and allocate its buffers (an index in
    /// [`Graph::scopes`]).
    Open(usize),
    /// Submit a task (an index in [`Graph::tasks`]).
    Task(usize),
    /// End a scope: its buffers are reclaimed once its tasks are done.
    End(usize),
}

/// A parsed, checked graph.
#[derive(Debug, Clone)]
pub struct Graph {
    /// Buffers: the `buffers` section in file order, then each scope's
    /// `alloc` declarations as they come.
    pub buffers: Vec<BufferDef>,
    /// Views: first one per buffer with a layout (named as the buffer),
    /// then the `views` section, then each scope's allocations and views.
    pub views: Vec<ViewDef>,
    /// Tasks, in submission order (those inside scopes included).
    pub tasks: Vec<TaskDef>,
    /// Scopes, in the order they open.
    pub scopes: Vec<ScopeDef>,
    /// What the run does, in order: scopes opened and ended around the
    /// tasks inside them.
    pub steps: Vec<Step>,
    /// Outputs.
    pub outputs: Vec<OutputDef>,
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
        let json: serde_json::Value = serde_json::from_str(&text)
            .or_else(|e| err("$", format!("{}: not JSON: {e}", path.display())))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Graph::from_json(&json, &dir, out_dir.unwrap_or(&dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph_with(task: &str) -> Result<Graph, GraphError> {
        let text = format!(
            r#"{{"buffers": {{"a": {{"shape": [4], "dtype": "f32"}}}}, "tasks": [{task}]}}"#
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        Graph::from_json(&json, Path::new("."), Path::new("."))
    }

    #[test]
    fn a_task_timeout_is_positive_finite_seconds() {
        let g = graph_with(r#"{"callable": "noop", "timeout": 0.25}"#).unwrap();
        assert_eq!(
            g.tasks[0].timeout,
            Some(std::time::Duration::from_millis(250))
        );
        let g = graph_with(r#"{"callable": "noop"}"#).unwrap();
        assert_eq!(g.tasks[0].timeout, None);
        for (timeout, want) in [
            ("0", "tasks[0].timeout: 0 seconds can never be met"),
            ("-1.5", "tasks[0].timeout: -1.5 seconds can never be met"),
            (
                r#""2s""#,
                "tasks[0].timeout: expected a number of seconds, found a string",
            ),
            ("1e300", "seconds is too long to count"),
        ] {
            let e = graph_with(&format!(r#"{{"callable": "noop", "timeout": {timeout}}}"#))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{timeout}: {e}");
        }
    }

    fn graph(text: &str) -> Result<Graph, GraphError> {
        let json: serde_json::Value = serde_json::from_str(text).unwrap();
        Graph::from_json(&json, Path::new("."), Path::new("."))
    }

    const SCOPED: &str = r#"{
        "buffers": {"a": {"shape": [4], "dtype": "f32"}},
        "tasks": [
            {"name": "first", "callable": "fill", "args": [{"view": "a", "tag": "output"}], "scalars": [1.0]},
            {"scope": {
                "alloc": {"t": {"shape": [4], "dtype": "f32"}},
                "views": {"t2": {"buffer": "t", "shape": [2], "offset": 2}},
                "tasks": [
                    {"callable": "copy", "args": [{"view": "a", "tag": "input"}, {"view": "t", "tag": "output"}]},
                    {"scope": {
                        "alloc": {"u": {"shape": [2], "dtype": "f32"}},
                        "tasks": [
                            {"callable": "copy", "args": [{"view": "t2", "tag": "input"}, {"view": "u", "tag": "output"}],
                             "after": ["first"]}
                        ]
                    }},
                    {"callable": "copy", "args": [{"view": "t", "tag": "input"}, {"view": "a", "tag": "output"}],
                     "after": [0]}
                ]
            }},
            {"callable": "noop", "after": [0]}
        ]
    }"#;

    #[test]
    fn scopes_open_allocate_and_end_around_their_tasks() {
        let g = graph(SCOPED).unwrap();
        assert_eq!(
            g.steps,
            vec![
                Step::Task(0),
                Step::Open(0),
                Step::Task(1),
                Step::Open(1),
                Step::Task(2),
                Step::End(1),
                Step::Task(3),
                Step::End(0),
                Step::Task(4),
            ]
        );
        assert_eq!(g.scopes[0].path, "tasks[1].scope");
        assert_eq!(g.scopes[1].path, "tasks[1].scope.tasks[1].scope");
        assert_eq!(g.scopes[1].parent, Some(0));
        let t = g.buffers.iter().find(|b| b.name == "t").unwrap();
        assert_eq!((t.scope, t.nbytes), (Some(0), 16));
        assert_eq!(
            g.buffers.iter().find(|b| b.name == "u").unwrap().scope,
            Some(1)
        );
        assert_eq!(g.tasks[2].path, "tasks[1].scope.tasks[1].scope.tasks[0]");
        // An index names a task of the same array; a name any earlier one.
        assert_eq!(g.tasks[2].after, vec![0]);
        assert_eq!(g.tasks[3].after, vec![1]);
        assert_eq!(g.tasks[4].after, vec![0]);
        let t2 = g.views.iter().find(|v| v.name == "t2").unwrap();
        assert_eq!(
            (t2.byte_offset, t2.path.as_str()),
            (8, "tasks[1].scope.views.t2")
        );
    }

    #[test]
    fn scope_mistakes_are_named_by_their_path() {
        let cases = [
            (
                SCOPED.replace(r#"{"callable": "noop", "after": [0]}"#, r#"{"callable": "copy", "args": [{"view": "u", "tag": "input"}, {"view": "a", "tag": "output"}]}"#),
                r#"tasks[2].args[0].view: unknown view "u": it belongs to the scope at tasks[1].scope.tasks[1].scope, which has ended"#,
            ),
            (
                SCOPED.replace(r#""after": ["first"]"#, r#""after": [0]"#),
                "tasks[1].scope.tasks[1].scope.tasks[0].after[0]: task 0 is not an earlier task",
            ),
            (
                SCOPED.replace(r#"{"callable": "noop", "after": [0]}"#, r#"{"callable": "noop", "after": [1]}"#),
                "tasks[2].after[0]: element 1 of this array is a scope, not a task",
            ),
            (
                SCOPED.replace(r#""u": {"shape": [2], "dtype": "f32"}"#, r#""t": {"shape": [2], "dtype": "f32"}"#),
                r#"tasks[1].scope.tasks[1].scope.alloc.t: the name "t" is taken"#,
            ),
            (
                SCOPED.replace(r#""u": {"shape": [2], "dtype": "f32"}"#, r#""u": {"shape": [2], "dtype": "f32", "init": "zeros"}"#),
                "tasks[1].scope.tasks[1].scope.alloc.u.init: unknown field; expected one of shape, dtype",
            ),
            (
                SCOPED.replace(r#""u": {"shape": [2], "dtype": "f32"}"#, r#""u": {"shape": [2]}"#),
                "tasks[1].scope.tasks[1].scope.alloc.u.dtype: missing (an allocation needs a shape and a dtype)",
            ),
            (
                SCOPED.replace(r#""u": {"shape": [2], "dtype": "f32"}"#, r#""u": {"shape": [4294967295, 4294967295, 4294967295], "dtype": "c128"}"#),
                "tasks[1].scope.tasks[1].scope.alloc.u.shape: too large: its size in bytes overflows 64 bits",
            ),
            (
                SCOPED.replace(r#""views": {"t2": {"buffer": "t", "shape": [2], "offset": 2}}"#, r#""views": {"t2": {"buffer": "t", "shape": [2], "offset": 3}}"#),
                "tasks[1].scope.views.t2: view out of bounds",
            ),
            (
                SCOPED.replace(r#"{"scope": {
                        "alloc": {"u""#, r#"{"scope": 7, "x": {
                        "alloc": {"u""#),
                "tasks[1].scope.tasks[1].x: unknown field; expected one of scope",
            ),
            (
                SCOPED.replace(r#""tasks": [
                            {"callable": "copy", "args": [{"view": "t2""#, r#""tasks": [], "t": [
                            {"callable": "copy", "args": [{"view": "t2""#),
                "tasks[1].scope.tasks[1].scope.t: unknown field; expected one of alloc, views, tasks, comment",
            ),
        ];
        for (text, want) in cases {
            let e = graph(&text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{want}\n got {e}");
        }
        let no_tasks = r#"{"buffers": {"a": {"size": 4}}, "tasks": [{"scope": {"alloc": {}}}]}"#;
        assert_eq!(
            graph(no_tasks).unwrap_err().to_string(),
            "tasks[0].scope.tasks: missing"
        );
    }
}
