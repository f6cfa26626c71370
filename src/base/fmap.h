/* fmap.h: read-only file mappings (weights stay in the mapping, never copied). */
#ifndef DFL_BASE_FMAP_H
#define DFL_BASE_FMAP_H

#include "dflash.h"

typedef struct fmap {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
} fmap;

/* Longest path accepted (PATH_MAX - 1 on Linux): longer ones are an error, never cut. */
#define FMAP_PATH_MAX 4095

/* Maps the whole file read-only. Only regular files (a FIFO, device or directory is an error at
 * once, without blocking or reading). */
dfl_status fmap_open(fmap *map, const char *path, dfl_error *err);
void fmap_close(fmap *map);
/* Drops this process's pages of the whole pages inside [p, p + n) of a read-only mapping (the
 * memory stays valid: a later read faults them in again from the file). For data that has been
 * copied elsewhere (packed weights), so that it is not resident twice. */
void fmap_release(const void *p, size_t n);

#endif
