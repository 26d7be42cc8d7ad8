#include "heap.h"

#include <assert.h>
#include <stdlib.h>

static inline int
node_less(const tl_heap_node *a, const tl_heap_node *b)
{
    if (a->key != b->key)
        return a->key < b->key;
    return a->seq < b->seq;
}

/* Each node in the heap knows its index (what remove() relies on). */
static inline int
node_at(const tl_heap *h, size_t i, const tl_heap_node *n)
{
    return i < h->len && h->nodes[i] == n && n->index == i;
}

static inline void
place(tl_heap *h, size_t i, tl_heap_node *n)
{
    assert(i < h->len);
    h->nodes[i] = n;
    n->index = i;
}

static void
sift_up(tl_heap *h, size_t i)
{
    tl_heap_node *n = h->nodes[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!node_less(n, h->nodes[parent]))
            break;
        place(h, i, h->nodes[parent]);
        i = parent;
    }
    place(h, i, n);
}

static void
sift_down(tl_heap *h, size_t i)
{
    tl_heap_node *n = h->nodes[i];
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        tl_heap_node *bn = n;
        if (l < h->len && node_less(h->nodes[l], bn)) {
            best = l;
            bn = h->nodes[l];
        }
        if (l + 1 < h->len && node_less(h->nodes[l + 1], bn)) {
            best = l + 1;
            bn = h->nodes[l + 1];
        }
        if (best == i)
            break;
        place(h, i, bn);
        i = best;
    }
    place(h, i, n);
}

int
tl_heap_push(tl_heap *h, tl_heap_node *n)
{
    assert(n->index == TL_HEAP_NOT_IN);   /* in one heap at most, once */
    if (h->len == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        tl_heap_node **nodes = realloc(h->nodes, cap * sizeof(*nodes));
        if (nodes == NULL)
            return -1;
        h->nodes = nodes;
        h->cap = cap;
    }
    h->nodes[h->len] = n;
    n->index = h->len;
    __atomic_store_n(&h->len, h->len + 1, __ATOMIC_RELAXED);   /* read by diagnostics */
    sift_up(h, h->len - 1);
    assert(node_at(h, n->index, n));
    return 0;
}

void
tl_heap_remove(tl_heap *h, tl_heap_node *n)
{
    size_t i = n->index;
    /* Out of the heap (popped, cancelled twice): nothing to do.  An index
     * that points elsewhere would be a corrupt heap. */
    assert(i == TL_HEAP_NOT_IN || node_at(h, i, n));
    if (i == TL_HEAP_NOT_IN || i >= h->len || h->nodes[i] != n)
        return;
    n->index = TL_HEAP_NOT_IN;
    __atomic_store_n(&h->len, h->len - 1, __ATOMIC_RELAXED);
    if (i == h->len)
        return;
    tl_heap_node *last = h->nodes[h->len];
    place(h, i, last);
    if (i > 0 && node_less(last, h->nodes[(i - 1) / 2]))
        sift_up(h, i);
    else
        sift_down(h, i);
}

tl_heap_node *
tl_heap_pop(tl_heap *h)
{
    if (h->len == 0)
        return NULL;
    tl_heap_node *top = h->nodes[0];
    assert(node_at(h, 0, top));
    tl_heap_remove(h, top);
    assert(top->index == TL_HEAP_NOT_IN);
    assert(h->len == 0 || node_at(h, 0, h->nodes[0]));
    return top;
}

void
tl_heap_free(tl_heap *h)
{
    free(h->nodes);
    h->nodes = NULL;
    h->len = h->cap = 0;
}
