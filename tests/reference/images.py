#!/usr/bin/python3
"""Images written, decoded and resized by Pillow, the reference of difftrain's image reading
and preparation (model/io/image.h, model/data/image_folder.h):

    /usr/bin/python3 tests/reference/images.py make DIR SIZE [BUCKETS]

Writes DIR/images/<class>/<name> (Pillow's PNG and JPEG encoders; random pixels, smooth
enough for JPEG to keep structure, of odd sizes and every colour mode the reader takes) and
DIR/expected.safetensors with, for each image k in ImageFolder order (classes sorted, then
paths):
  pixels.k   U8 [H, W, C]   np.asarray(Image.open(file)): what decoding must give exactly
  square.rgb.k   F32 [3, SIZE, SIZE]   convert("RGB"), the centre square of the shorter side
                                       (offsets rounded down), resize((SIZE, SIZE), BOX)
  dit.rgb.k      F32 [3, SIZE, SIZE]   convert("RGB"), DiT's center_crop_arr (train.py)
  square.grey.k, dit.grey.k            the same from convert("L")
each through ToTensor and Normalize(0.5, 0.5) as DiT's transform: (x/255 - 0.5)/0.5 in float32;
and as diffusers' VaeImageProcessor.preprocess(image, height, width) prepares an image to
image pipeline's input,
  stretch.rgb.k  F32 [3, SIZE - 2, SIZE + 3]   convert("RGB"), resize((SIZE + 3, SIZE - 2),
                                               LANCZOS), 2 · (x/255) - 1 in float32
  stretch.grey.k                               the same from convert("L").
and as its inpainting pipelines' mask processor prepares a mask (resize in the image's own
colours, then grey and binarised; alpha dropped first),
  mask.k         F32 [SIZE - 2, SIZE + 3]      convert("RGB" or "L"), resize((SIZE + 3, SIZE - 2),
                                               LANCZOS), convert("L"), x/255 >= 0.5 as 1, else 0
and Pillow's BILINEAR resize (the filter of torchvision's transforms.Resize on PIL images) of
each image's convert("RGB") and convert("L"), as bytes:
  bilinear.src.rgb.k, bilinear.src.grey.k   U8 [H, W, C]  the converted image, which is resized
  bilinear.J.rgb.k, bilinear.J.grey.k       U8 [h, w, C]  resize((w, h), BILINEAR) for the
                                            J-th (w, h) of bilinear_sizes(SIZE).
With BUCKETS, aspect-ratio buckets "HxW,HxW,..." (pixels, height x width), the bucketed crop
(SDXL's multi-aspect training, MosaicML diffusion's bucketed crop with a centred crop):
  bucket.k           I32 [1]            the bucket nearest the image's aspect ratio, by
                                        |log(H/W) - log(h/w)|, the first of equals
  buckets.rgb.k      F32 [3, h, w]      convert("RGB"), scaled by s = max(w/W, h/H) to
                                        (max(round(W s), w), max(round(H s), h)) with
                                        resize(..., BILINEAR), the centred w x h (offsets
                                        rounded down), normalised as DiT's
  buckets.grey.k                        the same from convert("L")
  bucket_geometry.k  I32 [6]            original height and width, the crop's top and left in
                                        the resized image, h and w
Exit status: 0, or 2 for bad usage.
"""

import math
import os
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402


def smooth(rng, h, w, c):
    """Low-frequency noise in bytes: a few random gradients and blobs."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    planes = []
    for _ in range(c):
        a, b, f, g = rng.uniform(-1, 1, 4)
        v = np.sin(6 * a * x + 4 * b * y + f) + 0.5 * np.cos(9 * g * x * y)
        v += 0.2 * rng.standard_normal((h, w))
        planes.append(v)
    v = np.stack(planes, axis=-1)
    v = (v - v.min()) / (v.max() - v.min())
    return np.round(255 * v).astype(np.uint8)


# (class, file, mode, height, width): PNG in every mode, JPEG colour and grey, a square image,
# images smaller than SIZE (enlarging), one DiT halves twice, and one whose width scaled into a
# bucket of 5/4 SIZE x 3/4 SIZE is a half exactly (12.5 at SIZE 16: Python's round makes it 12).
FILES = [
    ("bags", "a.png", "RGB", 37, 53),
    ("bags", "b.jpg", "RGB", 48, 40),
    ("bags", "nested/c.png", "RGBA", 30, 30),
    ("shoes", "d.jpeg", "L", 33, 41),
    ("shoes", "e.png", "L", 12, 9),
    ("shoes", "f.png", "LA", 50, 31),
    ("shoes", "g.png", "RGB", 40, 25),
    ("shoes", "h.jpg", "RGB", 70, 90),
]


def center_crop_arr(pil_image, image_size):
    """DiT's train.py preprocessing, as published."""
    while min(*pil_image.size) >= 2 * image_size:
        pil_image = pil_image.resize(tuple(x // 2 for x in pil_image.size), resample=Image.BOX)
    scale = image_size / min(*pil_image.size)
    pil_image = pil_image.resize(tuple(round(x * scale) for x in pil_image.size),
                                 resample=Image.BICUBIC)
    arr = np.array(pil_image)
    crop_y = (arr.shape[0] - image_size) // 2
    crop_x = (arr.shape[1] - image_size) // 2
    return Image.fromarray(arr[crop_y: crop_y + image_size, crop_x: crop_x + image_size])


def square_crop(image, size):
    w, h = image.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    return image.crop((left, top, left + side, top + side)).resize((size, size), Image.BOX)


def normalised(image):
    x = np.asarray(image).astype(np.float32)
    if x.ndim == 2:
        x = x[..., None]
    return (x.transpose(2, 0, 1) / np.float32(255) - np.float32(0.5)) / np.float32(0.5)


def stretched(image, size):
    x = np.asarray(image.resize((size + 3, size - 2), Image.LANCZOS)).astype(np.float32)
    if x.ndim == 2:
        x = x[..., None]
    return np.float32(2.0) * (x.transpose(2, 0, 1) / np.float32(255.0)) - np.float32(1.0)


def masked(image, size):
    colour = image.mode in ("RGB", "RGBA")
    grey = image.convert("RGB" if colour else "L").resize((size + 3, size - 2), Image.LANCZOS)
    x = np.asarray(grey.convert("L")).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray((x >= 0.5).astype(np.float32))


def bilinear_sizes(size):
    """(width, height) pairs: one side shrunk and the other enlarged (or both, by image), both
    enlarged, both shrunk several times."""
    return [(size + 3, size - 2), (2 * size + 1, size + 5), (5, 7)]


def nearest_bucket(buckets, width, height):
    distances = [abs(math.log(height / width) - math.log(h / w)) for h, w in buckets]
    best = min(range(len(buckets)), key=lambda k: distances[k])
    # The test's pictures are not near a tie, so float logs decide as exact arithmetic would.
    assert all(k == best or d - distances[best] > 1e-9 for k, d in enumerate(distances))
    return best


def bucket_crop(image, bucket):
    """MosaicML diffusion's bucketed crop (RandomCropBucketedAspectRatioTransform) with a
    centred crop in place of its random one; torchvision's resize of a PIL image is
    Image.resize with BILINEAR."""
    h, w = bucket
    width, height = image.size
    scale = max(w / width, h / height)
    resized_w = max(round(width * scale), w)
    resized_h = max(round(height * scale), h)
    resized = image.resize((resized_w, resized_h), Image.BILINEAR)
    # torchvision's CenterCrop: int(round(d / 2.0)), half to even.
    top, left = int(round((resized_h - h) / 2.0)), int(round((resized_w - w) / 2.0))
    crop = resized.crop((left, top, left + w, top + h))
    return crop, np.array([height, width, top, left, h, w], dtype=np.int32)


def make(out, size, buckets=None):
    rng = np.random.default_rng(0)
    expected = {}
    k = 0
    for klass, name, mode, h, w in FILES:
        path = os.path.join(out, "images", klass, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
        pixels = smooth(rng, h, w, channels)
        if channels == 1:
            image = Image.fromarray(pixels[..., 0], mode=mode)
        else:
            image = Image.fromarray(pixels, mode=mode)
        if name.endswith(".png"):
            image.save(path)
        else:
            image.save(path, quality=90)
    names = []
    for klass in sorted({f[0] for f in FILES}):
        root = os.path.join(out, "images", klass)
        for dirpath, _, files in os.walk(root):
            names += [os.path.join(dirpath, f) for f in files]
    for path in sorted(names):
        image = Image.open(path)
        decoded = np.asarray(image)
        if decoded.ndim == 2:
            decoded = decoded[..., None]
        expected[f"pixels.{k}"] = decoded
        for key, mode in (("rgb", "RGB"), ("grey", "L")):
            converted = image.convert(mode)
            expected[f"square.{key}.{k}"] = normalised(square_crop(converted, size))
            expected[f"dit.{key}.{k}"] = normalised(center_crop_arr(converted, size))
            expected[f"stretch.{key}.{k}"] = np.ascontiguousarray(stretched(converted, size))
            src = np.asarray(converted)
            expected[f"bilinear.src.{key}.{k}"] = src if src.ndim == 3 else src[..., None]
            for j, (w, h) in enumerate(bilinear_sizes(size)):
                resized = np.asarray(converted.resize((w, h), Image.BILINEAR))
                expected[f"bilinear.{j}.{key}.{k}"] = (
                    resized if resized.ndim == 3 else resized[..., None])
        if buckets:
            bucket = nearest_bucket(buckets, *image.size)
            expected[f"bucket.{k}"] = np.array([bucket], dtype=np.int32)
            for key, mode in (("rgb", "RGB"), ("grey", "L")):
                crop, geometry = bucket_crop(image.convert(mode), buckets[bucket])
                expected[f"buckets.{key}.{k}"] = normalised(crop)
            expected[f"bucket_geometry.{k}"] = geometry
        expected[f"mask.{k}"] = masked(image, size)
        k += 1
    safetensors_np.write(os.path.join(out, "expected.safetensors"), expected)


def parse_buckets(text):
    """"HxW,HxW,..." as [(h, w), ...]."""
    return [tuple(int(side) for side in bucket.split("x")) for bucket in text.split(",")]


def main(argv):
    if len(argv) not in (4, 5) or argv[1] != "make":
        print(__doc__, file=sys.stderr)
        return 2
    make(argv[2], int(argv[3]), parse_buckets(argv[4]) if len(argv) == 5 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
