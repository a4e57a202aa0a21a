//! The Vulkan instance (1.3 where the loader has it, else 1.1: workgroup-scope
//! cooperative matrices need SPIR-V 1.6), with portability enumeration when the loader has
//! it and the validation layer (plus a message counter) on request.

use crate::config::Config;
use crate::error::{Result, VkCall, VkError};
use ash::{ext, khr, vk};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Where the debug messenger reports; boxed so that its address is stable.
struct MessageSink {
    count: AtomicU64,
    verbose: bool,
}

pub(crate) struct Instance {
    // Field order is irrelevant: Drop destroys explicitly, entry last.
    pub entry: ash::Entry,
    pub raw: ash::Instance,
    debug: Option<(ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    sink: Box<MessageSink>,
    pub validation_enabled: bool,
    /// The API version the instance was created with.
    pub api_version: u32,
}

unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    kind: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: `user` is the MessageSink boxed in Instance, which outlives the messenger.
    let sink = unsafe { &*(user as *const MessageSink) };
    let text = if data.is_null() {
        String::new()
    } else {
        // SAFETY: the layer passes a valid callback data struct for the call's duration.
        unsafe { (*data).message_as_c_str() }
            .map(|m| m.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let counted = !kind.contains(vk::DebugUtilsMessageTypeFlagsEXT::GENERAL)
        || kind.contains(vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION);
    if counted {
        sink.count.fetch_add(1, Ordering::Relaxed);
        eprintln!("fish-vk validation [{severity:?}]: {text}");
    } else if sink.verbose {
        eprintln!("fish-vk loader [{severity:?}]: {text}");
    }
    vk::FALSE
}

/// Whether `props` (instance or device extensions) lists `name`.
pub(crate) fn has_extension(props: &[vk::ExtensionProperties], name: &CStr) -> bool {
    props
        .iter()
        .any(|p| p.extension_name_as_c_str() == Ok(name))
}

impl Instance {
    pub fn create(entry: ash::Entry, config: &Config) -> Result<Instance> {
        // SAFETY: plain queries on a loaded entry.
        let version = unsafe { entry.try_enumerate_instance_version() }
            .call("vkEnumerateInstanceVersion")?
            .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_1 {
            return Err(VkError::NoDevice(format!(
                "the loader offers Vulkan {}.{}, 1.1 is required",
                vk::api_version_major(version),
                vk::api_version_minor(version)
            )));
        }
        let exts = unsafe { entry.enumerate_instance_extension_properties(None) }
            .call("vkEnumerateInstanceExtensionProperties")?;
        let layers = unsafe { entry.enumerate_instance_layer_properties() }
            .call("vkEnumerateInstanceLayerProperties")?;

        let api_version = if version >= vk::API_VERSION_1_3 {
            vk::API_VERSION_1_3
        } else {
            vk::API_VERSION_1_1
        };
        let mut ext_names = Vec::new();
        let mut flags = vk::InstanceCreateFlags::empty();
        if has_extension(&exts, khr::portability_enumeration::NAME) {
            ext_names.push(khr::portability_enumeration::NAME.as_ptr());
            flags |= vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR;
        }
        let mut layer_names = Vec::new();
        let validation_available = layers
            .iter()
            .any(|l| l.layer_name_as_c_str() == Ok(VALIDATION_LAYER));
        let validation_enabled = config.validate && validation_available;
        if config.validate && !validation_available && config.verbose {
            eprintln!("fish-vk: FISH_VK_VALIDATE=1 but the validation layer is not installed");
        }
        let debug_available = has_extension(&exts, ext::debug_utils::NAME);
        if validation_enabled {
            layer_names.push(VALIDATION_LAYER.as_ptr());
            if debug_available {
                ext_names.push(ext::debug_utils::NAME.as_ptr());
            }
        }

        let app = vk::ApplicationInfo::default()
            .application_name(c"fish")
            .engine_name(c"fish")
            .api_version(api_version);
        let info = vk::InstanceCreateInfo::default()
            .flags(flags)
            .application_info(&app)
            .enabled_extension_names(&ext_names)
            .enabled_layer_names(&layer_names);
        // SAFETY: every pointer in `info` refers to locals alive across the call.
        let raw = unsafe { entry.create_instance(&info, None) }.call("vkCreateInstance")?;

        let sink = Box::new(MessageSink {
            count: AtomicU64::new(0),
            verbose: config.verbose,
        });
        let mut instance = Instance {
            entry,
            raw,
            debug: None,
            sink,
            validation_enabled,
            api_version,
        };
        if validation_enabled && debug_available {
            let loader = ext::debug_utils::Instance::new(&instance.entry, &instance.raw);
            let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
                .message_severity(
                    vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                        | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
                )
                .message_type(
                    vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                        | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                        | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
                )
                .pfn_user_callback(Some(on_message))
                .user_data(&*instance.sink as *const MessageSink as *mut c_void);
            // SAFETY: the sink outlives the messenger (both owned by `instance`).
            let messenger = unsafe { loader.create_debug_utils_messenger(&info, None) }
                .call("vkCreateDebugUtilsMessengerEXT")?;
            instance.debug = Some((loader, messenger));
        }
        Ok(instance)
    }

    /// Validation messages (warnings and errors) seen so far.
    pub fn validation_messages(&self) -> u64 {
        self.sink.count.load(Ordering::Relaxed)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every child object (device, allocator) was destroyed by the owner first.
        unsafe {
            if let Some((loader, messenger)) = self.debug.take() {
                loader.destroy_debug_utils_messenger(messenger, None);
            }
            self.raw.destroy_instance(None);
        }
    }
}
