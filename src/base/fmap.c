/* fmap.c: mmap a whole file read-only, with clear errors. Only regular files are mapped: the
 * file is opened without blocking (a FIFO would otherwise wait for a writer in open) and its type
 * checked before anything is read; a path longer than FMAP_PATH_MAX is refused, never cut. */
#define _POSIX_C_SOURCE 200809L
#include "base/fmap.h"
#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "a special file";
}

dfl_status fmap_open(fmap *map, const char *path, dfl_error *err) {
    map->data = NULL;
    map->size = 0;
    if (path == NULL) return error_set(err, DFL_ERR_INVALID, "no file path");
    const size_t len = strlen(path);
    if (len > FMAP_PATH_MAX) {
        return error_set(err, DFL_ERR_IO, "path too long (%zu bytes; the limit is %d): %.80s...", len, FMAP_PATH_MAX,
                         path);
    }
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        return error_set(err, DFL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return error_set(err, DFL_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(err, DFL_ERR_IO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return error_set(err, DFL_ERR_IO, "%s: cannot mmap %lld bytes: %s", path,
                             (long long)st.st_size, strerror(e));
        }
        map->data = p;
        map->size = (size_t)st.st_size;
    }
    close(fd);
    return DFL_OK;
}

void fmap_release(const void *p, size_t n) {
    const long page = sysconf(_SC_PAGESIZE);
    if (p == NULL || page <= 0) return;
    const uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    const uintptr_t hi = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: failure changes nothing */
}

void fmap_close(fmap *map) {
    if (map->data != NULL) {
        munmap((void *)map->data, map->size);
    }
    map->data = NULL;
    map->size = 0;
}
