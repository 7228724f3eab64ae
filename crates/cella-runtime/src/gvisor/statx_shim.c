/*
 * Preloaded into every dynamically linked program of a gVisor sandbox (see preload.rs).
 *
 * gVisor's kernel of runsc 20221219 (Debian 12's) refuses `statx` and `newfstatat` with
 * EINVAL when their flags carry AT_NO_AUTOMOUNT, a flag Linux accepts and that is a no-op
 * on a kernel with no automount points, as gVisor's is. GNU coreutils always set it, so
 * `ls PATH`, `ls -l`, `stat` and their kin failed there. These wrappers clear the flag and
 * make the same system call, with the C library's calling convention (-1 and errno).
 *
 * Freestanding on purpose: no C library is linked (the system call is made here, errno is
 * set through the library's __errno_location when the program has one), so a program the
 * wrapper is preloaded into never needs a symbol it lacks.
 */

#define AT_NO_AUTOMOUNT 0x800

#if defined(__x86_64__) && !defined(__ILP32__)
#define NR_STATX 332
#define NR_NEWFSTATAT 262
static long raw5(long n, long a, long b, long c, long d, long e)
{
	long r;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	__asm__ volatile("syscall"
			 : "=a"(r)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
			 : "rcx", "r11", "memory");
	return r;
}
#elif defined(__aarch64__)
#define NR_STATX 291
#define NR_NEWFSTATAT 79
static long raw5(long n, long a, long b, long c, long d, long e)
{
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	__asm__ volatile("svc 0"
			 : "+r"(x0)
			 : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4)
			 : "memory");
	return x0;
}
#else
#error "the statx wrapper knows x86_64 and aarch64 (64-bit) only"
#endif

extern int *__errno_location(void) __attribute__((weak));

static int done(long r)
{
	if (r < 0 && r > -4096) {
		if (__errno_location)
			*__errno_location() = (int)-r;
		return -1;
	}
	return (int)r;
}

struct statx;
struct stat;

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
	return done(raw5(NR_STATX, dirfd, (long)path, flags & ~AT_NO_AUTOMOUNT, mask, (long)buf));
}

/* Called directly (not through the PLT): nothing else's fstatat is reached from here, and
 * the library has no slot the loader fills in later. */
static int do_fstatat(int dirfd, const char *path, struct stat *buf, int flags)
{
	return done(raw5(NR_NEWFSTATAT, dirfd, (long)path, (long)buf, flags & ~AT_NO_AUTOMOUNT, 0));
}

int fstatat(int dirfd, const char *path, struct stat *buf, int flags)
{
	return do_fstatat(dirfd, path, buf, flags);
}

int fstatat64(int dirfd, const char *path, struct stat *buf, int flags)
	__attribute__((alias("fstatat")));

/* What programs built against a C library older than 2.33 call for fstatat. */
int __fxstatat(int ver, int dirfd, const char *path, struct stat *buf, int flags)
{
	/* The kernel's own layout: 0 and 1 on x86_64, 0 on aarch64 (as the library checks). */
#if defined(__x86_64__)
	if (ver != 0 && ver != 1)
#else
	if (ver != 0)
#endif
		return done(-22);
	return do_fstatat(dirfd, path, buf, flags);
}

int __fxstatat64(int ver, int dirfd, const char *path, struct stat *buf, int flags)
	__attribute__((alias("__fxstatat")));
