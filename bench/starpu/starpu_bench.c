/*
 * StarPU side of the strata benchmark comparison.
 *
 * Usage: starpu_bench [--quick] [--scenario throughput|latency|stencil]...
 *
 * Prints one JSON object per line on stdout, one per measurement:
 *   {"system": "starpu", "scenario": S, "variant": V, "params": {...},
 *    "value": number, "unit": U, "ok": bool, "detail": "short text"}
 *
 * StarPU runs with exactly 2 CPU workers, no CUDA/OpenCL, and the "eager"
 * scheduler unless STARPU_SCHED is already set in the environment (the
 * scheduler actually used is reported in every "detail").
 * Exit status: 0 if every measurement is ok, 1 otherwise, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starpu.h>

#define NWORKERS 2
#define TILE 64 /* doubles per stencil tile */

static int quick;
static int any_failed;
static char sched_name[64] = "?";
static char version_str[32] = "?";
static int worker_ids[NWORKERS];

/* ------------------------------------------------------------------ util */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { putchar('\\'); putchar(c); }
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* params_json must be a complete JSON object text, e.g. {"n": 10} */
static void emit(const char *scenario, const char *variant, const char *params_json,
                 double value, const char *unit, int ok, const char *detail)
{
    char full[512];
    snprintf(full, sizeof full, "%s; starpu %s sched=%s ncpu=%d", detail,
             version_str, sched_name, NWORKERS);
    if (!(value == value) || value > 1e300 || value < -1e300) value = 0; /* no NaN/inf in JSON */
    printf("{\"system\": \"starpu\", \"scenario\": ");
    json_str(scenario);
    printf(", \"variant\": ");
    json_str(variant);
    printf(", \"params\": %s, \"value\": %.6g, \"unit\": ", params_json, value);
    json_str(unit);
    printf(", \"ok\": %s, \"detail\": ", ok ? "true" : "false");
    json_str(full);
    printf("}\n");
    fflush(stdout);
    if (!ok) any_failed = 1;
}

/* Submit a task; on failure free it (StarPU does not destroy unsubmitted tasks). */
static int submit(struct starpu_task *t)
{
    int ret = starpu_task_submit(t);
    if (ret != 0) {
        t->destroy = 0;
        starpu_task_destroy(t);
    }
    return ret;
}

/* ------------------------------------------------------------ throughput */

static uint64_t noop_count;

static void noop_cpu(void *buffers[], void *arg)
{
    (void)buffers; (void)arg;
    __atomic_fetch_add(&noop_count, 1, __ATOMIC_RELAXED);
}

static struct starpu_codelet cl_noop = {
    .cpu_funcs = {noop_cpu},
    .cpu_funcs_name = {"noop_cpu"},
    .nbuffers = 0,
    .name = "noop",
};

static void run_throughput(void)
{
    const long n = quick ? 10000 : 100000;
    char params[128];
    snprintf(params, sizeof params, "{\"tasks\": %ld, \"workers\": %d}", n, NWORKERS);

    /* warm-up */
    for (int i = 0; i < 200; i++) {
        struct starpu_task *t = starpu_task_create();
        t->cl = &cl_noop;
        submit(t);
    }
    starpu_task_wait_for_all();

    __atomic_store_n(&noop_count, 0, __ATOMIC_SEQ_CST);
    long failed = 0;
    int first_err = 0;
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        struct starpu_task *t = starpu_task_create();
        t->cl = &cl_noop;
        int ret = submit(t);
        if (ret) { failed++; if (!first_err) first_err = ret; }
    }
    starpu_task_wait_for_all();
    double wall = now_s() - t0;

    uint64_t done = __atomic_load_n(&noop_count, __ATOMIC_SEQ_CST);
    int ok = failed == 0 && done == (uint64_t)n;
    char detail[256];
    if (ok)
        snprintf(detail, sizeof detail,
                 "%ld no-buffer no-op tasks, wall %.4f s (create+submit+wait_for_all)", n, wall);
    else
        snprintf(detail, sizeof detail, "executed %" PRIu64 "/%ld, %ld submit failures (first %d)",
                 done, n, failed, first_err);
    emit("throughput", "noop_no_buffers", params, wall > 0 ? (double)n / wall : 0, "tasks/s", ok,
         detail);
}

/* --------------------------------------------------------------- latency */

static uint64_t per_worker[STARPU_NMAXWORKERS];

static void inc_cpu(void *buffers[], void *arg)
{
    (void)arg;
    uint64_t *v = (uint64_t *)STARPU_VARIABLE_GET_PTR(buffers[0]);
    (*v)++;
    int w = starpu_worker_get_id();
    if (w >= 0 && w < STARPU_NMAXWORKERS)
        __atomic_fetch_add(&per_worker[w], 1, __ATOMIC_RELAXED);
}

static struct starpu_codelet cl_inc = {
    .cpu_funcs = {inc_cpu},
    .cpu_funcs_name = {"inc_cpu"},
    .nbuffers = 1,
    .modes = {STARPU_RW},
    .name = "inc",
};

/* Submit a chain of n RW tasks on h alternating between the two workers. */
static long submit_chain(starpu_data_handle_t h, long n, int *first_err)
{
    long failed = 0;
    for (long i = 0; i < n; i++) {
        struct starpu_task *t = starpu_task_create();
        t->cl = &cl_inc;
        t->handles[0] = h;
        t->execute_on_a_specific_worker = 1;
        t->workerid = (unsigned)worker_ids[i % NWORKERS];
        int ret = submit(t);
        if (ret) { failed++; if (!*first_err) *first_err = ret; }
    }
    return failed;
}

static void run_latency(void)
{
    const long n = quick ? 1000 : 10000;
    char params[128];
    snprintf(params, sizeof params, "{\"hops\": %ld, \"workers\": %d}", n, NWORKERS);
    int first_err = 0;

    /* warm-up on a separate handle */
    {
        uint64_t w = 0;
        starpu_data_handle_t hw;
        starpu_variable_data_register(&hw, STARPU_MAIN_RAM, (uintptr_t)&w, sizeof w);
        submit_chain(hw, 20, &first_err);
        starpu_task_wait_for_all();
        starpu_data_unregister(hw);
    }
    memset(per_worker, 0, sizeof per_worker);
    first_err = 0;

    uint64_t val = 0;
    starpu_data_handle_t h;
    starpu_variable_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)&val, sizeof val);
    double t0 = now_s();
    long failed = submit_chain(h, n, &first_err);
    starpu_task_wait_for_all();
    double wall = now_s() - t0;
    starpu_data_unregister(h); /* makes val coherent in main RAM */

    uint64_t w0 = __atomic_load_n(&per_worker[worker_ids[0]], __ATOMIC_SEQ_CST);
    uint64_t w1 = __atomic_load_n(&per_worker[worker_ids[1]], __ATOMIC_SEQ_CST);
    int ok = failed == 0 && val == (uint64_t)n && w0 == (uint64_t)(n + 1) / 2 &&
             w1 == (uint64_t)n / 2;
    char detail[256];
    snprintf(detail, sizeof detail,
             "%ld-task STARPU_RW chain on one uint64 variable, pinned alternately to workers %d/%d; "
             "final=%" PRIu64 " per-worker=%" PRIu64 "/%" PRIu64 "%s",
             n, worker_ids[0], worker_ids[1], val, w0, w1, failed ? "; SUBMIT FAILURES" : "");
    emit("latency", "rw_chain_alternating_workers", params, wall / (double)n * 1e6, "us/hop", ok,
         detail);
}

/* --------------------------------------------------------------- stencil */

/*
 * Tile update (buffer 0 = own tile, RW; buffers 1.. = existing neighbours, R,
 * left before right):
 *   lanes 1..63: own[j] = 0.5*own[j] + 0.25*(sum of existing neighbours[j])
 *   lane 0:      own[0] = max(own[0], neighbours[0]...) + 1
 * Lane 0 is an exact, order-sensitive integer "wavefront" counter: it does not
 * decay, so reading a neighbour's old vs. new value always changes the result
 * (the diffusion lanes are contractive and would wash ordering errors out).
 */
static inline void tile_update(double *own, const double *l, const double *r)
{
    double m = own[0];
    if (l && l[0] > m) m = l[0];
    if (r && r[0] > m) m = r[0];
    for (int j = 1; j < TILE; j++) {
        double s;
        if (l && r) s = l[j] + r[j];
        else if (l) s = l[j];
        else if (r) s = r[j];
        else s = 0.0;
        own[j] = 0.5 * own[j] + 0.25 * s;
    }
    own[0] = m + 1.0;
}

static void stencil_cpu(void *buffers[], void *arg)
{
    (void)arg;
    struct starpu_task *t = starpu_task_get_current();
    int nb = STARPU_TASK_GET_NBUFFERS(t);
    double *own = (double *)STARPU_VECTOR_GET_PTR(buffers[0]);
    const double *l = nb > 1 ? (const double *)STARPU_VECTOR_GET_PTR(buffers[1]) : NULL;
    const double *r = nb > 2 ? (const double *)STARPU_VECTOR_GET_PTR(buffers[2]) : NULL;
    tile_update(own, l, r);
}

static struct starpu_codelet cl_st1 = {
    .cpu_funcs = {stencil_cpu}, .cpu_funcs_name = {"stencil_cpu"},
    .nbuffers = 1, .modes = {STARPU_RW}, .name = "stencil1",
};
static struct starpu_codelet cl_st2 = {
    .cpu_funcs = {stencil_cpu}, .cpu_funcs_name = {"stencil_cpu"},
    .nbuffers = 2, .modes = {STARPU_RW, STARPU_R}, .name = "stencil2",
};
static struct starpu_codelet cl_st3 = {
    .cpu_funcs = {stencil_cpu}, .cpu_funcs_name = {"stencil_cpu"},
    .nbuffers = 3, .modes = {STARPU_RW, STARPU_R, STARPU_R}, .name = "stencil3",
};

static void init_tiles(double *x, long k)
{
    for (long i = 0; i < k * TILE; i++)
        x[i] = (i % TILE == 0) ? 0.0 : (double)((i * 37) % 101) / 101.0;
}

/* Sequential reference: apply the tasks one by one in submission order. */
static void stencil_reference(double *x, long k, long steps)
{
    for (long s = 0; s < steps; s++)
        for (long i = 0; i < k; i++)
            tile_update(x + i * TILE, i > 0 ? x + (i - 1) * TILE : NULL,
                        i + 1 < k ? x + (i + 1) * TILE : NULL);
}

/* Run `steps` steps on k tiles through StarPU; returns submit failures, sets wall. */
static long stencil_starpu(double *buf, long k, long steps, double *wall, int *first_err)
{
    starpu_data_handle_t v;
    starpu_vector_data_register(&v, STARPU_MAIN_RAM, (uintptr_t)buf, (uint32_t)(k * TILE),
                                sizeof(double));
    struct starpu_data_filter f = {
        .filter_func = starpu_vector_filter_block,
        .nchildren = (unsigned)k,
    };
    starpu_data_partition(v, &f);
    starpu_data_handle_t *ch = malloc(sizeof *ch * (size_t)k);
    for (long i = 0; i < k; i++)
        ch[i] = starpu_data_get_sub_data(v, 1, (unsigned)i);

    long failed = 0;
    double t0 = now_s();
    for (long s = 0; s < steps; s++) {
        for (long i = 0; i < k; i++) {
            struct starpu_task *t = starpu_task_create();
            int nb = 0;
            t->handles[nb++] = ch[i];
            if (i > 0) t->handles[nb++] = ch[i - 1];
            if (i + 1 < k) t->handles[nb++] = ch[i + 1];
            t->cl = nb == 1 ? &cl_st1 : nb == 2 ? &cl_st2 : &cl_st3;
            int ret = submit(t);
            if (ret) { failed++; if (!*first_err) *first_err = ret; }
        }
    }
    starpu_task_wait_for_all();
    *wall = now_s() - t0;

    starpu_data_unpartition(v, STARPU_MAIN_RAM);
    starpu_data_unregister(v);
    free(ch);
    return failed;
}

static void run_stencil_k(long k)
{
    const long target = quick ? 5000 : 50000;
    long steps = (target + k - 1) / k;
    if (steps < 2) steps = 2;
    const long total = steps * k;
    char params[160], variant[32];
    snprintf(params, sizeof params,
             "{\"tiles\": %ld, \"tile_doubles\": %d, \"steps\": %ld, \"tasks\": %ld, \"workers\": %d}",
             k, TILE, steps, total, NWORKERS);
    snprintf(variant, sizeof variant, "k=%ld", k);
    int first_err = 0;

    /* warm-up: small separate problem through the same code path */
    {
        double w[4 * TILE];
        double wall_w;
        init_tiles(w, 4);
        stencil_starpu(w, 4, 2, &wall_w, &first_err);
    }
    first_err = 0;

    double *buf = malloc(sizeof(double) * (size_t)(k * TILE));
    double *ref = malloc(sizeof(double) * (size_t)(k * TILE));
    if (!buf || !ref) {
        emit("stencil", variant, params, 0, "us/task", 0, "out of memory");
        free(buf); free(ref);
        return;
    }
    init_tiles(buf, k);
    memcpy(ref, buf, sizeof(double) * (size_t)(k * TILE));

    double wall = 0;
    long failed = stencil_starpu(buf, k, steps, &wall, &first_err);
    stencil_reference(ref, k, steps);

    long bad = 0;
    double maxerr = 0;
    for (long i = 0; i < k * TILE; i++) {
        double e = buf[i] - ref[i];
        if (e < 0) e = -e;
        double tol = 1e-9 * (ref[i] > 1.0 || ref[i] < -1.0 ? (ref[i] > 0 ? ref[i] : -ref[i]) : 1.0);
        if (!(e <= tol)) bad++;
        if (e > maxerr) maxerr = e;
    }
    int ok = failed == 0 && bad == 0;
    char detail[256];
    snprintf(detail, sizeof detail,
             "%ld steps x %ld tasks (R left/right, RW own; vector_filter_block); "
             "vs sequential ref: %ld mismatches, max abs err %.3g, wavefront lane0=%.0f%s",
             steps, k, bad, maxerr, buf[(k - 1) * TILE], failed ? "; SUBMIT FAILURES" : "");
    emit("stencil", variant, params, wall / (double)total * 1e6, "us/task", ok, detail);
    free(buf);
    free(ref);
}

static void run_stencil(void)
{
    static const long full_k[] = {16, 64, 256, 1024, 4096};
    static const long quick_k[] = {16, 256};
    const long *ks = quick ? quick_k : full_k;
    int nk = quick ? 2 : 5;
    for (int i = 0; i < nk; i++)
        run_stencil_k(ks[i]);
}

/* ------------------------------------------------------------------ main */

struct scenario { const char *name; void (*fn)(void); int selected; };
static struct scenario scenarios[] = {
    {"throughput", run_throughput, 0},
    {"latency", run_latency, 0},
    {"stencil", run_stencil, 0},
};
#define NSCEN ((int)(sizeof scenarios / sizeof scenarios[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: starpu_bench [--quick] [--scenario throughput|latency|stencil]...\n");
}

int main(int argc, char **argv)
{
    int any_selected = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--scenario") && i + 1 < argc) {
            const char *name = argv[++i];
            int found = 0;
            for (int s = 0; s < NSCEN; s++)
                if (!strcmp(scenarios[s].name, name)) { scenarios[s].selected = 1; found = 1; }
            if (!found) {
                fprintf(stderr, "starpu_bench: unknown scenario '%s'\n", name);
                usage(stderr);
                return 2;
            }
            any_selected = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "starpu_bench: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!any_selected)
        for (int s = 0; s < NSCEN; s++) scenarios[s].selected = 1;

    /* Exactly 2 CPU workers, no accelerators, quiet, no calibration. */
    setenv("STARPU_NCPU", "2", 1);
    setenv("STARPU_NCUDA", "0", 1);
    setenv("STARPU_NOPENCL", "0", 1);
    setenv("STARPU_NMIC", "0", 1);
    setenv("STARPU_NMPI_MS", "0", 1);
    setenv("STARPU_SILENT", "1", 1);
    setenv("STARPU_CALIBRATE", "0", 1);
    setenv("STARPU_SCHED", "eager", 0); /* keep a user-provided scheduler */
    snprintf(sched_name, sizeof sched_name, "%s", getenv("STARPU_SCHED"));

    int maj = 0, min = 0, rev = 0;
    starpu_get_version(&maj, &min, &rev);
    snprintf(version_str, sizeof version_str, "%d.%d.%d", maj, min, rev);

    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.ncpus = NWORKERS;
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.sched_policy_name = sched_name;

    int ret = starpu_init(&conf);
    int nw = ret == 0 ? (int)starpu_cpu_worker_get_count() : 0;
    if (ret != 0 || nw != NWORKERS ||
        starpu_worker_get_ids_by_type(STARPU_CPU_WORKER, worker_ids, NWORKERS) != NWORKERS ||
        starpu_worker_get_count() != NWORKERS) {
        char detail[128];
        if (ret != 0) snprintf(detail, sizeof detail, "starpu_init failed: %d (%s)", ret, strerror(-ret));
        else snprintf(detail, sizeof detail, "expected %d CPU workers only, got %d CPU / %u total",
                      NWORKERS, nw, starpu_worker_get_count());
        for (int s = 0; s < NSCEN; s++)
            if (scenarios[s].selected)
                emit(scenarios[s].name, "init", "{}", 0, "", 0, detail);
        if (ret == 0) starpu_shutdown();
        return 1;
    }

    for (int s = 0; s < NSCEN; s++)
        if (scenarios[s].selected) scenarios[s].fn();

    starpu_shutdown();
    return any_failed ? 1 : 0;
}
