/* fmap.c: mmap a whole file read-only, with clear errors. */
#define _POSIX_C_SOURCE 200809L
#include "base/fmap.h"
#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

dfl_status fmap_open(fmap *map, const char *path, dfl_error *err) {
    map->data = NULL;
    map->size = 0;
    int fd = open(path, O_RDONLY);
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
        return error_set(err, DFL_ERR_IO, "%s: not a regular file", path);
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

void fmap_close(fmap *map) {
    if (map->data != NULL) {
        munmap((void *)map->data, map->size);
    }
    map->data = NULL;
    map->size = 0;
}
