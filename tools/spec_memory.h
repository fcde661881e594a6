/* tools/spec_memory: what `ember run`'s governor learnt about speculation on this machine, kept
 * between runs (--spec-memory), so that a run starts where the last one of the same setup
 * stopped instead of probing afresh: each probe that does not pay costs a drafter's block, and
 * a short run made several (models/README.md). A file of lines
 *
 *   <key> <known> <EM_DECODE_LEARNT_VALUES numbers>
 *
 * key: SHA-256 (hex) of the setup (the target's and the drafter's paths, sizes and times, the
 * devices, threads, verify width, expert storage, feature type); known and the numbers:
 * em_decode_learnt_get's. At most SPEC_MEMORY_LINES lines, the most recent last; a line that
 * does not parse is dropped. Writes go through a temporary file renamed over the old one, so a
 * reader never sees half a file. Nothing here is an error for the run: a file that cannot be
 * read or written is a warning, and the run goes on without it. */
#ifndef EM_TOOLS_SPEC_MEMORY_H
#define EM_TOOLS_SPEC_MEMORY_H

#include "model_flags.h"

#define SPEC_MEMORY_LINES 32

/* The default file: $XDG_CACHE_HOME/ember/spec-memory, else $HOME/.cache/ember/spec-memory;
 * false (out untouched) when neither variable is set. */
bool em_spec_memory_default(char *out, size_t cap);
/* The key of the setup f describes (its files must exist). */
int em_spec_memory_key(const em_model_flags *f, char key[65], em_err *err);
/* Gives s what the file holds for key, if anything (a damaged entry: a warning, nothing given). */
void em_spec_memory_load(const char *path, const char *key, em_decode *s);
/* Records what s learnt under key, keeping the other keys' lines (a warning when it cannot). */
void em_spec_memory_save(const char *path, const char *key, const em_decode *s);

/* For tests and the fuzz target: the numbers of key's line in text (len bytes), or false. */
bool em_spec_memory_find(const char *text, size_t len, const char *key, unsigned *known,
                         double v[EM_DECODE_LEARNT_VALUES]);

#endif
