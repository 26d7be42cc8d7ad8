/* Binary min-heap of timer nodes, ordered by (key, seq).  Each node knows its
 * index so a cancelled timer is removed in O(log n).  No Python.h here. */
#ifndef TIDELOOP_HEAP_H
#define TIDELOOP_HEAP_H

#include <stddef.h>
#include <stdint.h>

#define TL_HEAP_NOT_IN ((size_t)-1)

typedef struct {
    double key;        /* deadline; NaN is stored as -inf so it orders */
    uint64_t seq;      /* scheduling order breaks ties */
    size_t index;      /* position in the heap, TL_HEAP_NOT_IN when out */
} tl_heap_node;

typedef struct {
    tl_heap_node **nodes;
    size_t len;
    size_t cap;
} tl_heap;

int tl_heap_push(tl_heap *h, tl_heap_node *n);       /* -1: out of memory */
tl_heap_node *tl_heap_pop(tl_heap *h);                /* NULL when empty */
void tl_heap_remove(tl_heap *h, tl_heap_node *n);
void tl_heap_free(tl_heap *h);

static inline tl_heap_node *
tl_heap_top(const tl_heap *h)
{
    return h->len ? h->nodes[0] : NULL;
}

#endif
