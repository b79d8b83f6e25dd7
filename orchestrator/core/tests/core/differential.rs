//! The DAG and scheduler against one-by-one execution, on random programs.

use std::collections::HashMap;

use strata_orchestrator_core::dag::{Arg, NewTask};
use strata_orchestrator_core::sim::{
    Program, random_program, read_mostly_program, run_engine, run_sequential,
};
use strata_orchestrator_core::{Dag, TaskId};
use strata_wire::check::{Rng, byte_set};

fn seeds() -> u64 {
    // Debug builds check every invariant after every transition, which
    // makes a seed slow; CI runs thousands more in release (.ci/run).
    let default = if cfg!(debug_assertions) { 100 } else { 5000 };
    std::env::var("STRATA_DIFF_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `program` one by one and through the engine on 1–8 simulated
/// workers completing in random order, and asserts the bytes agree.
fn engine_agrees(program: &Program, seed: u64, rng: &mut Rng) {
    let want = run_sequential(program);
    let workers = rng.range(1, 8);
    let (got, stats) = run_engine(program, workers, rng);
    assert_eq!(stats.completed, program.tasks.len());
    for (id, bytes) in &want {
        assert_eq!(
            &got[id], bytes,
            "seed {seed}: buffer {id} differs ({workers} workers)"
        );
    }
}

/// Random programs (3–5 buffers, 2–4-D views of every class, every tag,
/// 50–500 tasks, some groups and explicit edges), run one by one and
/// through the engine on 1–8 simulated workers completing in random order:
/// the bytes are identical for every seed.
#[test]
fn engine_matches_sequential_execution() {
    let n = seeds();
    let mut total_tasks = 0usize;
    for seed in 0..n {
        let mut rng = Rng(seed);
        let tasks = rng.range(50, 500) as usize;
        let program = random_program(&mut rng, tasks);
        engine_agrees(&program, seed, &mut rng);
        total_tasks += program.tasks.len();
    }
    println!("differential: {n} seeds, {total_tasks} tasks, all identical to sequential execution");
}

/// Read-mostly programs (many unfinished readers of identical and of
/// partially overlapping views, a rare writer among them: the pattern of
/// inference), through the engine as above: the bytes are identical to
/// one-by-one execution for every seed.
#[test]
fn read_mostly_programs_match_sequential_execution() {
    let n = seeds() / 2;
    let (mut total_tasks, mut writers) = (0usize, 0usize);
    for seed in 0..n {
        let mut rng = Rng(0x4ead_0000 + seed);
        let tasks = rng.range(100, 600) as usize;
        let program = read_mostly_program(&mut rng, tasks);
        engine_agrees(&program, seed, &mut rng);
        total_tasks += program.tasks.len();
        writers += program
            .tasks
            .iter()
            .filter(|t| {
                t.members[0].iter().any(|a| {
                    a.tag.writes() && a.tensor.buffer().identity() == program.buffers[1].identity()
                })
            })
            .count();
    }
    assert!(
        writers * 30 < total_tasks * 3 && writers > 0,
        "{writers} of {total_tasks} tasks write the weights"
    );
    println!(
        "differential, read-mostly: {n} seeds, {total_tasks} tasks ({writers} weight updates), all identical to sequential execution"
    );
}

/// For every pair of tasks where one writes a byte the other touches, the
/// later is ordered after the earlier, transitively, in the DAG as built.
#[test]
fn no_missed_edges() {
    for seed in 0..200u64 {
        let mut rng = Rng(10_000 + seed);
        let program = random_program(&mut rng, 150);
        let mut dag = Dag::new();
        let pos: HashMap<TaskId, usize> = program
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id, i))
            .collect();
        let n = program.tasks.len();
        let words = n.div_ceil(64);
        let mut reach = vec![vec![0u64; words]; n];
        for (j, t) in program.tasks.iter().enumerate() {
            let task = NewTask {
                id: t.id,
                members: t.members.clone(),
                scalars: vec![0; t.members.len()],
                after: t.after.clone(),
            };
            let inserted = dag.check_and_insert(task).unwrap();
            for (p, _) in inserted.edges {
                let i = pos[&p];
                let row = reach[i].clone();
                for (w, r) in reach[j].iter_mut().zip(&row) {
                    *w |= r;
                }
                reach[j][i / 64] |= 1 << (i % 64);
            }
        }
        let bytes = |a: &Arg| byte_set(&a.tensor).unwrap();
        let accesses: Vec<Vec<(Arg, Vec<u64>)>> = program
            .tasks
            .iter()
            .map(|t| {
                t.members
                    .iter()
                    .flatten()
                    .filter(|a| a.tag != strata_wire::ArgTag::NoDep)
                    .map(|a| (*a, bytes(a)))
                    .collect()
            })
            .collect();
        for j in 0..n {
            for i in 0..j {
                let conflict = accesses[i].iter().any(|(a, ba)| {
                    accesses[j].iter().any(|(b, bb)| {
                        a.tensor.identity() == b.tensor.identity()
                            && (a.tag.writes() || b.tag.writes())
                            && ba.iter().any(|x| bb.binary_search(x).is_ok())
                    })
                });
                if conflict {
                    assert!(
                        reach[j][i / 64] & (1 << (i % 64)) != 0,
                        "seed {seed}: task {} not ordered after {}",
                        j,
                        i
                    );
                }
            }
        }
    }
}

/// Random programs with faults (kernel failures, and a worker lost without
/// a fence whose tasks go on writing until the fence — sometimes given up
/// on first): every byte whose last writer succeeded, or that nobody
/// writes, equals one-by-one execution of the tasks that succeeded. A late
/// write over a reported result, or a task that read a lost task's bytes
/// and succeeded, would show here.
#[test]
fn engine_with_faults_never_reports_success_with_different_bytes() {
    use strata_orchestrator_core::sched::Outcome;
    use strata_orchestrator_core::sim::{check_after_faults, run_engine_with_faults};
    let n = seeds();
    let (mut tasks, mut quarantined, mut abandoned, mut checked) = (0, 0, 0, 0);
    for seed in 0..n {
        let mut rng = Rng(77_000 + seed);
        let n_tasks = rng.range(50, 300) as usize;
        let program = random_program(&mut rng, n_tasks);
        let workers = rng.range(2, 6);
        let run = run_engine_with_faults(&program, workers, &mut rng);
        assert_eq!(run.outcomes.len(), program.tasks.len(), "seed {seed}");
        let ok = |t| run.outcomes.get(&t) == Some(&Outcome::Success);
        checked += check_after_faults(&program, &run.mem, &ok)
            .unwrap_or_else(|e| panic!("seed {seed} ({workers} workers): {e}"));
        tasks += program.tasks.len();
        quarantined += run.quarantined;
        abandoned += usize::from(run.abandoned);
    }
    assert!(
        quarantined > 0,
        "no run quarantined anything: the test has no teeth"
    );
    println!(
        "differential with faults: {n} seeds, {tasks} tasks, {quarantined} quarantined, \
         {abandoned} runs gave up on the fence, {checked} bytes checked"
    );
}
