//! fish-vk: the Vulkan device layer (filled in by the fish-vk work).
