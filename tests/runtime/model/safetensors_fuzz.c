/* libFuzzer target for the safetensors header parser: any byte string is treated as a
 * whole file image and must be rejected or accepted without a crash, leak or
 * out-of-bounds read (ASan/UBSan under --config=fuzz). The committed seed corpus holds
 * valid files and one example of each rejected defect. */
#include <stddef.h>
#include <stdint.h>

#include "runtime/model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)safetensors_validate(data, size, "fuzz-input");
    return 0;
}
