"""What the scenes measurements read from pixels besides adherence: the objects' pixels (benchmarks/scenes_content.py
splits tokens into object, edge and background by them)."""

import numpy as np

from csd_kernels.zoo.scenes import checker, world


def test_object_mask_is_the_rendered_shapes():
    rng = np.random.default_rng(3)
    for _ in range(30):
        scene = world.sample_scene(rng)
        want = np.zeros((world.CANVAS, world.CANVAS), bool)
        for o in scene.objects:
            row, col = divmod(o.cell, 3)
            want |= world.shape_mask(o.shape, o.size * world.CELL, (row + 0.5) * world.CELL, (col + 0.5) * world.CELL)
        assert np.array_equal(checker.object_mask(world.render(scene)), want), scene


def test_object_mask_drops_what_read_scene_drops():
    """A speck of an object colour below MIN_AREA is no object for read_scene, nor for the mask."""
    image = world.render(world.Scene((world.Obj("red", "square", 4, 0.6),), "flat", ((30, 30, 30),)))
    image[2:6, 2:6] = world.COLOURS["blue"]  # 16 pixels < MIN_AREA
    mask = checker.object_mask(image)
    assert not mask[2:6, 2:6].any() and mask[48, 48] and len(checker.read_scene(image)) == 1
    assert mask.sum() == (image == np.array(world.COLOURS["red"], np.uint8)).all(-1).sum()
