/* memcpy time by the distance from source to destination (modulo 4096) and size.
 *
 * On AMD Zen with glibc 2.36, copies of 4 KiB .. 512 KiB whose destination lies 1 to
 * 63 bytes after the source (modulo 4096) run about 20 times slower than at any other
 * distance: glibc copies them with `rep movsb`, which the processor slows down there.
 * switchyard_msg::copy avoids that case; docs/benchmarks/log.md has the figures.
 *
 *   gcc -O2 scripts/memcpy-distance.c -o /tmp/memcpy-distance && /tmp/memcpy-distance
 *   GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=4294967295 /tmp/memcpy-distance
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Best of 3 timings of `memcpy(dst, src, n)`, in microseconds. */
static double time_copy(char *dst, const char *src, size_t n) {
    int reps = (int)((256u << 20) / n);
    double best = 1e30;
    for (int k = 0; k < 3; k++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) {
            memcpy(dst, src, n);
            __asm__ volatile("" ::"r"(dst) : "memory");
        }
        double t = (now() - t0) / reps;
        if (t < best) best = t;
    }
    return best * 1e6;
}

int main(void) {
    size_t area = 64u << 20;
    char *a = aligned_alloc(4096, area), *b = aligned_alloc(4096, area);
    if (!a || !b) return 1;
    memset(a, 1, area);
    memset(b, 2, area);
    size_t sizes[] = {2048, 4096, 65536, 262144, 524288, 524289, 1u << 20, 4u << 20, 16u << 20};
    long distances[] = {0, 16, 32, 64, -16, 4096 + 16};
    printf("%10s", "bytes");
    for (size_t d = 0; d < sizeof distances / sizeof *distances; d++) printf("  dist %6ld", distances[d]);
    printf("   (us per copy)\n");
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        printf("%10zu", sizes[s]);
        for (size_t d = 0; d < sizeof distances / sizeof *distances; d++) {
            char *src = a + 8192, *dst = b + 8192 + distances[d];
            printf("  %11.2f", time_copy(dst, src, sizes[s]));
        }
        printf("\n");
    }
    return 0;
}
